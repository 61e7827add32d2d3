#!/usr/bin/env bash
# CI services for the postgres and browser tests, on a fresh Debian machine (run as root):
# PostgreSQL on 127.0.0.1 with a test role and database, and Debian's Chromium + ChromeDriver.
# Idempotent: a second run installs nothing and leaves the running server alone.
# The role, password and database match eagle_data_tests/test_postgres_instance.py's defaults
# (EAGLE_TEST_PG_* override them there); they guard a throwaway loopback server, not a secret.
set -euo pipefail

PG_USER="${EAGLE_TEST_PG_USER:-eagle_test}"
PG_PASSWORD="${EAGLE_TEST_PG_PASSWORD:-eagle_test}"
PG_DB="${EAGLE_TEST_PG_DB:-eagle_test}"
PACKAGES=(postgresql chromium chromium-driver fonts-dejavu-core)

missing=()
for pkg in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if ((${#missing[@]})); then
  echo "[services] installing ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# One cluster (the package makes it); start it where no server answers yet. Debian's default
# listen_addresses is localhost, so it is reachable on 127.0.0.1 only.
read -r version cluster < <(pg_lsclusters -h | awk 'NR == 1 {print $1, $2}')
pg_lsclusters -h | awk 'NR == 1 {print $4}' | grep -q online || pg_ctlcluster "$version" "$cluster" start
for _ in $(seq 30); do pg_isready -q -h 127.0.0.1 && break; sleep 1; done
pg_isready -h 127.0.0.1

psql_admin() { runuser -u postgres -- psql -v ON_ERROR_STOP=1 -qtA "$@"; }
if [[ -z "$(psql_admin -c "SELECT 1 FROM pg_roles WHERE rolname = '$PG_USER'")" ]]; then
  psql_admin -c "CREATE ROLE $PG_USER"
fi
# CREATEDB: the test makes a fresh database per run and drops it afterwards.
psql_admin -c "ALTER ROLE $PG_USER LOGIN CREATEDB PASSWORD '$PG_PASSWORD'"
if [[ -z "$(psql_admin -c "SELECT 1 FROM pg_database WHERE datname = '$PG_DB'")" ]]; then
  psql_admin -c "CREATE DATABASE $PG_DB OWNER $PG_USER"
fi
echo "[services] postgres $version/$cluster on 127.0.0.1: database $PG_DB, role $PG_USER"
echo "[services] $(chromium --version 2>/dev/null) · $(chromedriver --version | cut -d' ' -f1-2)"
