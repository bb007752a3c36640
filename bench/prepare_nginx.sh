#!/usr/bin/env bash
# Builds .ngx/ on this (Debian 12, networked) machine: Debian's nginx and the shared libraries
# it needs that another distribution may lack, for bench/scale.py on the offline GPU machine,
# which has no nginx. Kept out of git (.git/info/exclude, like .whl/ and .rg/).
#   .ngx/nginx           wrapper: sets LD_LIBRARY_PATH for nginx alone and execs bin/nginx
#   .ngx/bin/nginx       Debian's nginx (1.22, needs glibc >= 2.34)
#   .ngx/lib/            libssl, libcrypto, libpcre2-8, libz (glibc >= 2.34)
#   .ngx/lib-fallback/   libcrypt.so.1, used only on a host without its own: Debian 12's needs
#                        glibc 2.36 (arc4random_buf), newer than Ubuntu 22.04's 2.35
# Then one device call carrying it: carry [".whl", ".ngx"], command: bash bench/gpu_session.sh scale
# Usage, from the project root: bash bench/prepare_nginx.sh [nginx_*.deb]  (default: apt-get download nginx)
set -euo pipefail
[ -f pyproject.toml ] || { echo "run from the project root" >&2; exit 2; }
mkdir -p .git/info
grep -qx /.ngx/ .git/info/exclude 2>/dev/null || echo /.ngx/ >> .git/info/exclude
work=$(mktemp -d) && chmod 755 "$work"  # apt-get download runs as _apt
trap 'rm -rf "$work"' EXIT
if [ $# -ge 1 ]; then
  cp "$1" "$work/"
else
  (cd "$work" && apt-get download nginx >/dev/null)
fi
dpkg-deb -x "$work"/nginx_*.deb "$work/root"
binary=$work/root/usr/sbin/nginx

rm -rf .ngx && mkdir -p .ngx/bin .ngx/lib .ngx/lib-fallback
cp "$binary" .ngx/bin/nginx
# The libraries as this machine resolves them (the .deb holds none); each needs only libc besides.
for name in libssl.so.3 libcrypto.so.3 libpcre2-8.so.0 libz.so.1 libcrypt.so.1; do
  path=$(ldd "$binary" | awk -v lib="$name" '$1 == lib { print $3 }')
  [ -n "$path" ] || { echo "nginx does not link $name: update this script" >&2; exit 1; }
  case $name in libcrypt.so.1) dest=.ngx/lib-fallback ;; *) dest=.ngx/lib ;; esac
  cp -L "$path" "$dest/$name"
done
unexpected=$(ldd "$binary" | awk '$1 ~ /^lib/ && $1 !~ /^(libssl|libcrypto|libpcre2-8|libz|libcrypt|libc)\.so/ { print $1 }')
[ -z "$unexpected" ] || { echo "nginx links more libraries than carried: $unexpected" >&2; exit 1; }

cat > .ngx/nginx <<'EOF'
#!/bin/sh
# Debian's nginx with its carried libraries (bench/prepare_nginx.sh); LD_LIBRARY_PATH is set for
# nginx alone, so that Python and the CUDA stack keep the host's libssl and libz.
here=$(cd "$(dirname "$0")" && pwd)
libs=$here/lib
have_crypt=no
for dir in /lib/x86_64-linux-gnu /usr/lib/x86_64-linux-gnu /lib64 /usr/lib64 /usr/lib /lib; do
  [ -e "$dir/libcrypt.so.1" ] && have_crypt=yes && break
done
[ $have_crypt = yes ] || libs=$libs:$here/lib-fallback
LD_LIBRARY_PATH=$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} exec "$here/bin/nginx" "$@"
EOF
chmod +x .ngx/nginx

# Highest glibc symbol version each file needs: the floor for the GPU machine.
for file in .ngx/bin/nginx .ngx/lib/* .ngx/lib-fallback/*; do
  echo "$file needs $(objdump -T "$file" | grep -o 'GLIBC_[0-9.]*' | sort -uV | tail -1)"
done
.ngx/nginx -V 2>&1 | sed -n 1,2p
# A config in the shape bench/scale.py writes, checked with -t (-e: no compiled-in log path is opened).
prefix=$work/prefix && mkdir -p "$prefix"
cat > "$prefix/nginx.conf" <<EOF
worker_processes 1;
pid $prefix/nginx.pid;
error_log $prefix/error.log;
events { worker_connections 64; }
http {
    client_body_temp_path $prefix/body; proxy_temp_path $prefix/proxy; fastcgi_temp_path $prefix/fastcgi;
    uwsgi_temp_path $prefix/uwsgi; scgi_temp_path $prefix/scgi;
    upstream u { least_conn; server 127.0.0.1:9 max_fails=3 fail_timeout=5s; keepalive 32; }
    server { listen 127.0.0.1:18080; access_log off; location / { proxy_pass http://u; } }
}
EOF
.ngx/nginx -t -p "$prefix" -e "$prefix/error.log" -c "$prefix/nginx.conf"
du -sh .ngx
