"""Settings of the service: one object, read once at start-up from `PENCIL_*` environment
variables (and a `.env` file in the working directory, if present)."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import Field, PrivateAttr, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from app.api_keys import parse_api_keys

MIB = 1024 * 1024
ORIGINS_PATTERN = r"^\s*(\*|https?://[^\s,/]+(\s*,\s*https?://[^\s,/]+)*)?\s*$"  # '*' or a list of origins


class Settings(BaseSettings):
    """Every setting, with its environment variable PENCIL_<NAME>."""

    model_config = SettingsConfigDict(env_prefix="PENCIL_", env_file=".env", extra="ignore")

    host: str = Field("127.0.0.1", description="address `pencil-gpu serve` binds")
    port: int = Field(8000, ge=1, le=65535, description="port `pencil-gpu serve` listens on")
    processes: int = Field(
        0,
        ge=0,
        le=256,
        description=(
            "server processes sharing the port and the GPUs, each with its own render workers and GPU "
            "pool, so the host's codecs and Python use several cores; one of them runs the batch "
            "jobs. 0: three for every four host cores with CUDA, one on the CPU backend"
        ),
    )
    process_index: int | None = Field(
        None,
        ge=0,
        description=(
            "set by `pencil-gpu serve` for each of its processes (0, 1, ...): with several GPUs, "
            "process i renders on the i-th device of PENCIL_DEVICES, round robin"
        ),
    )
    mps: Literal["auto", "on", "off"] = Field(
        "auto",
        description=(
            "CUDA MPS for several server processes on one GPU: auto starts a private daemon when "
            "nvidia-cuda-mps-control is available and CUDA_MPS_PIPE_DIRECTORY is not set; on requires "
            "it"
        ),
    )
    backend: Literal["auto", "cuda", "cpu"] = Field("auto", description="auto: CUDA when a device answers, else CPU")
    workers: int = Field(
        2,
        ge=1,
        le=256,
        description="renders running at once (threads); with CUDA, when not set, one per GPU lease (devices x streams)",
    )
    max_queue: int = Field(16, ge=0, le=10_000, description="renders allowed to wait; past it /sketch answers 503")
    max_upload_bytes: int = Field(25 * MIB, ge=1024, description="largest uploaded image in bytes (413 past it)")
    upload_timeout_s: float = Field(
        30.0,
        gt=0.0,
        le=3600.0,
        description=(
            "longest wait for the next piece of a request body (every upload); past it, or past the "
            "minimum rate, 408 upload_timeout and the connection is closed"
        ),
    )
    max_header_bytes: int = Field(
        64 * 1024,
        ge=4096,
        le=16 * MIB,
        description=(
            "largest request line and headers of a request, in bytes, in `pencil-gpu serve`; past it the "
            "server answers 431 headers_too_large at once and closes the connection"
        ),
    )
    header_timeout_s: float = Field(
        30.0,
        gt=0.0,
        le=3600.0,
        description=(
            "longest time a request's line and headers may take to arrive (from the connection's opening, or "
            "the request's first byte), in `pencil-gpu serve`; past it the connection is closed"
        ),
    )
    keep_alive_s: float = Field(
        5.0,
        gt=0.0,
        le=3600.0,
        description=(
            "longest time a connection is kept open between two requests, in `pencil-gpu serve`; then it is "
            "closed (a proxy pooling connections to the server must close its idle ones sooner)"
        ),
    )
    max_connections: int = Field(
        1000,
        ge=16,
        le=1_000_000,
        description=(
            "connections one server process of `pencil-gpu serve` holds at once; past it the connection idle "
            "longest is closed, or, when every one has a request in flight, the new request gets 503 overloaded "
            "(probes: /healthz, /readyz, /metrics are answered)"
        ),
    )
    upload_min_bytes_per_s: float = Field(
        1024.0,
        ge=0.0,
        description=(
            "slowest upload taken: the waits for a body's pieces may add up to PENCIL_UPLOAD_TIMEOUT_S plus "
            "one second for every this many bytes received, so a trickle cannot hold a connection "
            "(0: no minimum)"
        ),
    )
    refused_drain_bytes: int = Field(
        4 * MIB,
        ge=0,
        description=(
            "a request answered before its body was read (503 overloaded, 413, ...): up to this many bytes "
            "of the body are read and dropped after the answer, so that the client reads the answer rather "
            "than a reset; the connection of a larger body (or one of unknown length) is then closed"
        ),
    )
    refused_drain_s: float = Field(
        2.0, ge=0.0, le=60.0, description="longest time spent reading and dropping the body of such a request"
    )
    max_pixels: int = Field(
        50_000_000, ge=256, description="largest decoded image in pixels (413 past it, decided from the header)"
    )
    max_live_sessions: int = Field(
        16,
        ge=0,
        le=10_000,
        description=(
            "/live sessions open at once on this host, all server processes together; past it a connection "
            "closes with 1013 (0 turns /live off)"
        ),
    )
    max_live_pixels: int = Field(
        1920 * 1080, ge=256, description="largest /live frame in pixels (an error message for that frame past it)"
    )
    live_origins: str = Field(
        "",
        pattern=ORIGINS_PATTERN,
        description=(
            "web pages allowed to open /live besides the server's own: '*' (any), or origins like "
            "'https://app.example.com,http://localhost:5173'; empty: the server's own pages only (a browser "
            "on another site is refused with 403; clients that send no Origin header, not browsers, are let in)"
        ),
    )
    cors_origins: str = Field(
        "",
        pattern=ORIGINS_PATTERN,
        description=(
            "web pages of other sites allowed to call the API from a browser (CORS; preflights answered) and "
            "to open /live: '*' (any), or origins like 'https://app.example.com'; empty: none (no CORS headers)"
        ),
    )
    api_keys: SecretStr | None = Field(
        None,
        description=(
            "API keys of /sketch and /live, as 'name:key,name:key' (keys: 16 to 256 of A-Za-z0-9._~-); with "
            "keys (here or in PENCIL_API_KEYS_FILE) a request without a known key answers 401; unset: open"
        ),
    )
    api_keys_file: Path | None = Field(
        None,
        description="a file of more API keys, one 'name:key' a line ('#' starts a comment), e.g. a mounted secret",
    )
    metrics_token: SecretStr | None = Field(
        None, description="Bearer token GET /metrics asks for (401 without it); unset: /metrics is open"
    )
    rate_limit: float = Field(
        0.0,
        ge=0.0,
        le=1_000_000.0,
        description=(
            "requests a second each client may make to /sketch and /live on average (by API key name with keys, "
            "else by address), on the whole host; past it 429 rate_limited with Retry-After. 0: no limit"
        ),
    )
    rate_limit_burst: int = Field(
        10, ge=1, le=1_000_000, description="requests a client may make at once before PENCIL_RATE_LIMIT applies"
    )
    live_sessions_per_client: int = Field(
        0,
        ge=0,
        le=10_000,
        description=(
            "/live sessions one client (API key name, else address) may hold at once on this host, so that one "
            "client cannot take every slot of PENCIL_MAX_LIVE_SESSIONS; past it 1013. 0: no share"
        ),
    )
    live_slots_dir: Path | None = Field(
        None,
        description=(
            "set by `pencil-gpu serve` for its processes: where they count /live sessions together; unset, "
            "a process counts its own"
        ),
    )
    max_concurrent_pixels: int = Field(
        0,
        ge=0,
        description=(
            "pixels rendered at once across all workers; bounds memory (the CPU backend needs about 60 bytes a "
            "pixel). 0: PENCIL_MAX_PIXELS + PENCIL_LARGE_RENDER_PIXELS, the largest photo beside a small one"
        ),
    )
    large_render_pixels: int = Field(
        12_500_000,
        ge=1,
        description=(
            "renders of more pixels are large: together they hold at most all workers but one and leave this "
            "many pixels of PENCIL_MAX_CONCURRENT_PIXELS free, so a smaller photo never waits for them"
        ),
    )
    devices: str = Field(
        "all", pattern=r"^\s*(all|\d+(\s*,\s*\d+)*)\s*$", description="CUDA devices to use: 'all' or a list like '0,1'"
    )
    streams: int = Field(
        4, ge=1, le=64, description="leases (stream pairs) per GPU: renders and jobs running at once on one device"
    )
    gpu_memory_fraction: float = Field(
        0.9,
        gt=0.0,
        le=1.0,
        description=(
            "share of each GPU's memory the pools of all server processes may hold together: with "
            "several processes on a card their renders share half, the process running the batch jobs "
            "holds the other half"
        ),
    )
    batch_share: float = Field(
        0.5,
        gt=0.0,
        le=1.0,
        description="share of each GPU's leases batch jobs may hold at once, so /sketch is never starved",
    )
    lease_timeout_s: float = Field(
        30.0, gt=0.0, le=3600.0, description="longest wait for a GPU lease before a render answers 503"
    )
    admin_token: SecretStr | None = Field(
        None, description="Bearer token of the /jobs endpoints; unset, they answer 503"
    )
    webhook_secret: SecretStr | None = Field(
        None,
        description=(
            "key of the HMAC-SHA256 signature of job webhooks (Pencil-Signature); unset, a submission "
            "with ?webhook= answers 422"
        ),
    )
    max_event_streams: int = Field(
        256, ge=1, le=100_000, description="GET /jobs/{id}/events streams open at once per server process"
    )
    job_streams: int = Field(
        2, ge=1, le=64, description="jobs running at once, each on one GPU lease at batch priority"
    )
    max_job_upload_bytes: int = Field(
        512 * MIB, ge=1024, description="largest request body of POST /jobs/* in bytes (413 past it)"
    )
    max_matrix_elements: int = Field(
        67_108_864, ge=1, description="largest matrix an SVD job takes, in elements (m x n)"
    )
    database_url: SecretStr | None = Field(
        None,
        description=(
            "PostgreSQL URL (postgresql://user:password@host:5432/db) of a job store shared by replicas on "
            "several hosts, which must then share PENCIL_DATA_DIR; unset: SQLite in PENCIL_DATA_DIR, one host"
        ),
    )
    job_lease_s: float = Field(
        30.0,
        ge=1.0,
        le=3600.0,
        description=(
            "a running job's lease: its replica renews it every third of this; a replica that stops renewing "
            "(dead, cut off) loses its jobs to the queue after this long"
        ),
    )
    replica_id: str | None = Field(
        None,
        min_length=1,
        max_length=200,
        description="this replica's name in job records and logs (default: the host name)",
    )
    job_retention_days: float = Field(
        7.0, gt=0.0, description="finished jobs and their files are deleted after this many days"
    )
    data_dir: Path = Field(
        Path("data"),
        description=(
            "directory for the service's persistent data: jobs and corpora (created at start-up when "
            "PENCIL_ADMIN_TOKEN turns the jobs on)"
        ),
    )
    min_free_bytes: int = Field(
        64 * MIB,
        ge=0,
        description=(
            "free space the data directory must have for /readyz to answer 200 (with jobs on): below it, 503 "
            "saying how much is free, before submissions start failing with 507 (0: no check)"
        ),
    )
    log_level: Literal["critical", "error", "warning", "info", "debug"] = Field("info", description="log verbosity")
    log_format: Literal["auto", "json", "text"] = Field(
        "auto",
        description=(
            "log lines as JSON (one object a line) or text for a person; auto: text when stderr is a "
            "terminal, else JSON"
        ),
    )
    max_stencil_points: int = Field(
        1 << 30, ge=125, description="largest grid a stencil job takes (nx * ny * nz; the GPU holds 12 bytes a point)"
    )
    max_stencil_cpu_points: int = Field(
        1 << 24,
        ge=125,
        description="largest stencil grid on the CPU backend (the NumPy reference: about 28 bytes a point)",
    )
    max_stencil_point_steps: int = Field(
        10**14,
        ge=1,
        description="most interior points x steps one stencil job may run on a GPU (about 8 min at 200 GPts/s)",
    )
    max_stencil_cpu_point_steps: int = Field(
        2 * 10**10,
        ge=1,
        description="the same on the CPU backend (about 6 min at the NumPy reference's 50 MPts/s on 2 cores)",
    )
    max_cs256_elements: int = Field(
        67_108_864,
        ge=1,
        description=(
            "largest matrix a CS256 job takes, in elements (m x n); the CPU backend needs about 25 "
            "bytes per element while it prunes"
        ),
    )
    max_corpus_bytes: int = Field(
        4 * 1024 * MIB,
        ge=1,
        description="largest corpus POST /corpora stores, in bytes (413 past it); streamed to disk",
    )
    max_search_text_bytes: int = Field(
        64 * MIB,
        ge=1,
        description="largest text a search job takes inline (`text`), in bytes; larger texts go through /corpora",
    )
    search_resident_fraction: float = Field(
        0.5,
        gt=0.0,
        le=1.0,
        description=(
            "share of each GPU's pool memory that corpora kept resident between searches may hold "
            "(least recently used evicted first)"
        ),
    )

    _api_key_table: dict[str, str] = PrivateAttr(default_factory=dict)

    @model_validator(mode="after")
    def _read_api_keys(self) -> Settings:
        """PENCIL_API_KEYS and PENCIL_API_KEYS_FILE, checked now: a bad entry stops the start."""
        text = self.api_keys.get_secret_value() if self.api_keys is not None else ""
        if self.api_keys_file is not None:
            try:
                lines = self.api_keys_file.read_text(encoding="utf-8").splitlines()
            except (OSError, UnicodeDecodeError) as exc:
                raise ValueError(f"PENCIL_API_KEYS_FILE {self.api_keys_file} cannot be read: {exc}") from None
            entries = [line.split("#", 1)[0].strip() for line in lines]
            text = ",".join(filter(None, [text, *entries]))
        self._api_key_table = parse_api_keys(text)
        return self

    @property
    def api_key_table(self) -> dict[str, str]:
        """The API keys by name; empty when /sketch and /live are open."""
        return self._api_key_table

    @model_validator(mode="after")
    def _default_pixel_budget(self) -> Settings:
        """PENCIL_MAX_CONCURRENT_PIXELS=0 (the default): room for the largest photo and a small one."""
        if self.max_concurrent_pixels == 0:
            self.max_concurrent_pixels = self.max_pixels + self.large_render_pixels
        return self

    def upload_limit(self, path: str) -> int:
        """Largest upload, in bytes, for a request to `path`: jobs take big matrices, corpora big texts."""
        return getattr(self, self._upload_limit_field(path))

    def upload_limit_variable(self, path: str) -> str:
        """The environment variable that sets upload_limit(path), for error messages."""
        return f"PENCIL_{self._upload_limit_field(path).upper()}"

    @staticmethod
    def _upload_limit_field(path: str) -> str:
        if path == "/corpora" or path.startswith("/corpora/"):
            return "max_corpus_bytes"
        return "max_job_upload_bytes" if path == "/jobs" or path.startswith("/jobs/") else "max_upload_bytes"


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return Settings()
