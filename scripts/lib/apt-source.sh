# Sourced by the install scripts: fetch_source PACKAGE WORKDIR downloads the distribution's
# source package PACKAGE (its .dsc and tarballs) into WORKDIR. The machine's own package sources
# are copied as `deb-src` entries into a private apt state under WORKDIR/apt, so /etc/apt is
# never changed. On failure it prints apt's log and returns 1.
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
