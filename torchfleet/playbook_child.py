"""ansible-playbook as the API starts it: ended by SIGTERM when the process that started it
dies (a controller killed outright), instead of going on alone with nothing to report to.
The run itself is the guards' to supervise; `torchfleet attach` follows it again."""

import os
import signal
import sys


def main() -> None:
    if sys.platform.startswith("linux"):
        import ctypes

        # PR_SET_PDEATHSIG; it holds across the exec below.
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)
        if os.getppid() == 1:  # the parent died before the call above
            sys.exit(143)
    beside = os.path.join(os.path.dirname(sys.executable), "ansible-playbook")
    os.execvp(beside if os.path.exists(beside) else "ansible-playbook", ["ansible-playbook", *sys.argv[1:]])


if __name__ == "__main__":
    main()
