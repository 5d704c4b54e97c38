"""The controller-side plugins need the torchfleet package in the Python that runs Ansible.

./scripts/bootstrap.sh installs it into .venv. Any other ansible-playbook fails here with a
message that says what to do, rather than a bare ImportError in some plugin.
"""

import sys

try:
    import torchfleet  # noqa: F401
except ImportError as exc:
    from ansible.errors import AnsibleError

    raise AnsibleError(
        f"the torchfleet package is not installed in the Python that runs Ansible ({sys.executable}): "
        "run ./scripts/bootstrap.sh and use .venv/bin/ansible-playbook (or source .venv/bin/activate), "
        "or `pip install -e .` from the checkout into that Python"
    ) from exc
