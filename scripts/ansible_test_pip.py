"""Let ansible-test make its sanity virtualenvs on a machine that reaches PyPI and no other host.

ansible-test creates each sanity test's virtualenv without pip, then runs a get-pip.py bootstrap
that it downloads from Ansible's CI file host into ~/.ansible/test/cache, unless a copy is already
there. That host cannot be reached here. This writes the stand-in that ansible-test's own message
says may be saved there: it installs the pip version ansible-test asks for, from that version's
wheel taken from PyPI, as get-pip.py does. Every sanity tool is then installed by that pip from
PyPI at the versions ansible-test pins; none is skipped or replaced.

Usage: python scripts/ansible_test_pip.py   (prints the stand-in's path; a no-op once written)
"""

from __future__ import annotations

import pathlib
import subprocess
import sys
import types

from ansible_test._internal.python_requirements import get_venv_packages

STAND_IN = '''\
"""get-pip.py for ansible-test, written by torchfleet's scripts/ansible_test_pip.py.

Installs pip from the wheel beside this file, as get-pip.py installs its embedded copy.
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, {wheel!r}))

from pip._internal.cli.main import main  # noqa: E402

# get-pip.py takes these two flags for itself; pip install does not know them.
ARGS = [arg for arg in sys.argv[1:] if arg not in ("--no-setuptools", "--no-wheel")]
sys.exit(main(["install", "--upgrade", "--force-reinstall", "--find-links", HERE, *ARGS]))
'''


def main() -> int:
    # The same call ansible-test makes before its bootstrap; the version does not depend on Python's.
    version = get_venv_packages(types.SimpleNamespace(version=f'{sys.version_info[0]}.{sys.version_info[1]}'))['pip']
    cache = pathlib.Path('~/.ansible/test/cache').expanduser()
    stand_in = cache / f'get_pip_{version.replace(".", "_")}.py'
    wheel = f'pip-{version}-py3-none-any.whl'
    if not (stand_in.exists() and (cache / wheel).exists()):
        cache.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [sys.executable, '-m', 'pip', 'download', '--quiet', '--disable-pip-version-check',
             '--no-deps', '--only-binary', ':all:', '--dest', str(cache), f'pip=={version}'],
            check=True,
        )
        partial = stand_in.with_suffix('.partial')
        partial.write_text(STAND_IN.format(wheel=wheel))
        partial.replace(stand_in)
    print(stand_in)
    return 0


if __name__ == '__main__':
    sys.exit(main())
