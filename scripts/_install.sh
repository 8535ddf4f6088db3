# Sourced by scripts/_venv.sh and the peer scripts: `venv_install VENV ARGS...` installs ARGS
# (pip's syntax) into the virtual environment VENV.
#
# It uses uv (`uv pip install`, put into VENV first) where uv installs: the same versions pip
# resolves (the two environments' `pip freeze` compared equal for dvml[test,docs]) in about a
# quarter of the time (44 s against 178 s for dvml[test,docs], 24 s against ~80 s for the MLflow
# peer, on a fresh 2-core machine), which is most of what a fresh CI clone spends before its
# first test. Without uv (no wheel for the platform, an index it cannot read) it is pip, as
# before; DVML_NO_UV=1 forces pip.
venv_install() {
  local venv="$1"; shift
  if [ -z "${DVML_NO_UV:-}" ] &&
     { "$venv/bin/python" -m uv --version >/dev/null 2>&1 ||
       "$venv/bin/python" -m pip install --quiet "uv>=0.5" >/dev/null 2>&1; } &&
     "$venv/bin/python" -m uv pip install --quiet --python "$venv/bin/python" "$@"; then
    return 0
  fi
  "$venv/bin/python" -m pip install --quiet --upgrade pip
  "$venv/bin/python" -m pip install --quiet "$@"
}
