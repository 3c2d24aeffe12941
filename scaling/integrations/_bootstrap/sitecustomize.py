"""Run at start-up in every Python process `scaling attach` starts (scaling/integrations/auto.py):
the trainers' callbacks attached on import, then the environment's own sitecustomize."""

import sys

try:
    from scaling.integrations import auto
except ImportError as exc:  # an interpreter without the lab: the job runs unmeasured, and says why
    print(f"scaling attach: {sys.executable} cannot import scaling ({exc}): not measured", file=sys.stderr)
else:
    auto.install_from_environment()
    auto.run_shadowed_sitecustomize()
