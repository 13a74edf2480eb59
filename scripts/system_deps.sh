#!/usr/bin/env bash
# System packages and services the tests need, installed/started only when missing.
# - Debian's chromium (headless browser tests; Playwright drives /usr/bin/chromium; the sweep
#   report's vector figures: kaleido drives it too).
# - pdflatex with booktabs, graphicx and hyperref (texlive-latex-base + -recommended) and
#   poppler-utils (pdftotext, pdftoppm): `manage.py report --format pdf` and its tests.
# - PostgreSQL and Redis are started before every session and CI on this project's machines;
#   if one has stopped, start it again with its usual command.
# `bash scripts/system_deps.sh report` installs the packages only (what `make demo` runs for its
# PDF report) and starts no service.
set -uo pipefail
WHAT="${1:-all}"
if ! command -v chromium >/dev/null 2>&1; then
  echo "installing Debian chromium for the browser tests"
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq -o DPkg::Lock::Timeout=300 chromium >/dev/null) \
    || { echo "ERROR: could not install chromium (apt-get)"; exit 1; }
fi
if ! command -v pdflatex >/dev/null 2>&1 || ! kpsewhich booktabs.sty >/dev/null 2>&1 \
   || ! command -v pdftotext >/dev/null 2>&1; then
  echo "installing Debian texlive (pdflatex, booktabs) and poppler-utils for the sweep report"
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
     -o DPkg::Lock::Timeout=300 texlive-latex-base texlive-latex-recommended poppler-utils >/dev/null) \
    || { echo "ERROR: could not install texlive-latex-base texlive-latex-recommended poppler-utils (apt-get)"; exit 1; }
fi
[ "$WHAT" = report ] && exit 0
if ! redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1; then
  if command -v redis-server >/dev/null 2>&1; then
    echo "starting redis-server on 127.0.0.1:6379"
    mkdir -p /var/lib/redis /var/log/redis
    redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no \
      --dir /var/lib/redis --logfile /var/log/redis/ci.log
  fi
fi
if ! pg_isready -h 127.0.0.1 -p 5432 >/dev/null 2>&1; then
  if command -v pg_ctlcluster >/dev/null 2>&1; then
    echo "starting PostgreSQL"
    pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -1)" main start || true
  fi
fi
exit 0
