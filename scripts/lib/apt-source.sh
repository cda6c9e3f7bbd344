# Sourced by the install scripts: private apt states, so /etc/apt and /var/lib/apt never change.
#
# fetch_source PACKAGE WORKDIR downloads the distribution's source package PACKAGE (its .dsc and
# tarballs) into WORKDIR. The machine's own package sources are copied as `deb-src` entries into
# a private apt state under WORKDIR/apt. On failure it prints apt's log and returns 1.
fetch_source() {
  local pkg=$1 work=$2 aptd=$2/apt f n=0
  mkdir -p "$aptd/parts" "$aptd/lists/partial" "$aptd/cache/archives/partial"
  shopt -s nullglob
  for f in /etc/apt/sources.list.d/*.sources; do
    # deb822: every stanza that lists `deb` becomes a `deb-src` stanza.
    awk '/^Types:/ { if ($0 ~ /(^|[ \t])deb([ \t]|$)/) $0 = "Types: deb-src"; else $0 = "Types: none" } { print }' \
      "$f" | grep -v '^Types: none' >"$aptd/parts/src$((n++)).sources" || true
  done
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
    [ -r "$f" ] || continue
    sed -n 's/^[[:space:]]*deb[[:space:]]/deb-src /p' "$f" >"$aptd/parts/src$((n++)).list"
  done
  shopt -u nullglob
  local apto=(-o Dir::Etc::SourceList=/dev/null -o "Dir::Etc::SourceParts=$aptd/parts"
              -o "Dir::State::Lists=$aptd/lists" -o "Dir::Cache=$aptd/cache"
              -o APT::Sandbox::User=root)
  if ! (cd "$work" && apt-get "${apto[@]}" -qq update >"$work/apt.log" 2>&1 \
        && apt-get "${apto[@]}" -qq source --download-only "$pkg" >>"$work/apt.log" 2>&1); then
    cat "$work/apt.log" >&2
    echo "could not fetch $pkg's source from this machine's apt sources" >&2
    return 1
  fi
}

# apt_private SUITE ARCH WORKDIR: a private apt state in WORKDIR/apt for ARCH's binary packages of
# Debian's SUITE. It reads this machine's package sources, each entry of the machine's own release
# only (its -updates and -security entries dropped: a release's own packages are the ones wanted),
# that release renamed SUITE. Runs `apt-get update` (log in WORKDIR/apt.log) and sets APTO, the
# options that make apt-get and apt-cache use that state. Returns 1 when no source names this
# machine's release or apt fails.
apt_private() {
  local suite=$1 arch=$2 work=$3 aptd=$3/apt mine f n=0
  mine=$(. /etc/os-release && echo "${VERSION_CODENAME:-}")
  rm -rf "$aptd"
  mkdir -p "$aptd/parts" "$aptd/state" "$aptd/lists/partial" "$aptd/cache/archives/partial"
  touch "$aptd/state/status"
  shopt -s nullglob
  for f in /etc/apt/sources.list.d/*.sources; do
    # deb822: a stanza is kept when its Suites: name the machine's release.
    awk -v mine="$mine" -v suite="$suite" '
      /^Suites:/ { keep = 0; for (i = 2; i <= NF; i++) if ($i == mine) keep = 1; $0 = "Suites: " suite }
      { stanza = stanza $0 "\n" }
      /^[[:space:]]*$/ { if (keep) printf "%s", stanza; stanza = ""; keep = 0 }
      END { if (keep) printf "%s\n", stanza }' "$f" >"$aptd/parts/s$((n++)).sources"
  done
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
    [ -r "$f" ] || continue
    # deb [OPTIONS] URI RELEASE COMPONENTS...
    awk -v mine="$mine" -v suite="$suite" '/^[[:space:]]*deb[[:space:]]/ {
        i = 2; if ($2 ~ /^\[/) { while (i <= NF && $i !~ /\]$/) i++; i++ }
        if ($(i + 1) != mine) next
        $(i + 1) = suite; print }' "$f" >"$aptd/parts/s$((n++)).list"
  done
  shopt -u nullglob
  APTO=(-o Dir::Etc::SourceList=/dev/null -o "Dir::Etc::SourceParts=$aptd/parts"
    -o "Dir::State=$aptd/state" -o "Dir::State::Lists=$aptd/lists" -o "Dir::State::status=$aptd/state/status"
    -o "Dir::Cache=$aptd/cache" -o "APT::Architecture=$arch" -o "APT::Architectures::=$arch"
    -o APT::Sandbox::User=root)
  if ! grep -qs . "$aptd"/parts/*; then
    echo "no package source in /etc/apt names this machine's release (${mine:-none in /etc/os-release})" >"$work/apt.log"
    return 1
  fi
  apt-get "${APTO[@]}" -qq update >"$work/apt.log" 2>&1
}
