"""The job system: batch jobs stored (jobs/store.py, on SQLite or PostgreSQL), run by one
process of each replica (jobs/runner.py, jobs/leader.py) through each kind's front door in
gpu/<kind>, and the corpora search jobs read (jobs/corpora.py). It knows no HTTP: app/jobs/
serves it."""
