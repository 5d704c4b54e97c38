import pytest

from torchfleet.errors import InventoryError
from torchfleet.redact import HIDDEN, check_env, has_credentials, redact, split_env


@pytest.mark.parametrize("text, shown", [
    ("http://user:s3cret@proxy.example.com:3128", "http://***@proxy.example.com:3128"),
    ("https://__token__:pypi-AgEIcHl@pypi.example.com/simple/", "https://***@pypi.example.com/simple/"),
    # A token alone, before the host, is a secret as much as a password.
    ("https://ghp_abc123@index.example.com/simple", "https://***@index.example.com/simple"),
    # An unescaped @ in the password: the credentials run to the last @ before the host.
    ("http://bob:p@ss@proxy:3128/", "http://***@proxy:3128/"),
    ("socks5h://u:p@10.0.0.1:1080", "socks5h://***@10.0.0.1:1080"),
    ("HTTP_PROXY was http://u:p@a:1 and https://v:q@b:2 now", "HTTP_PROXY was http://***@a:1 and https://***@b:2 now"),
    # Nothing to hide.
    ("http://proxy.example.com:3128", "http://proxy.example.com:3128"),
    ("http://proxy/path/user@example.com", "http://proxy/path/user@example.com"),
    ("https://host/search?q=a@b", "https://host/search?q=a@b"),
    ("mail me: someone@example.com", "mail me: someone@example.com"),
    ("10.20.0.0/24,localhost", "10.20.0.0/24,localhost"),
    ("", ""),
])
def test_redact_hides_url_credentials_only(text, shown):
    assert redact(text) == shown
    assert has_credentials(text) == (shown != text)


def test_redact_takes_any_value():
    assert redact(3128) == "3128"


def test_split_env_moves_urls_with_credentials_to_the_secret_part():
    env = {"http_proxy": "http://u:pw@proxy:3128", "no_proxy": "10.0.0.0/8", "GLOO_DEVICE_TRANSPORT": "TCP"}
    parts = split_env(env, {"API_TOKEN": "tok-123"})
    assert parts["public"] == {"no_proxy": "10.0.0.0/8", "GLOO_DEVICE_TRANSPORT": "TCP"}
    assert parts["secret"] == {"http_proxy": "http://u:pw@proxy:3128", "API_TOKEN": "tok-123"}
    assert parts["shown"] == {"http_proxy": "http://***@proxy:3128", "no_proxy": "10.0.0.0/8",
                              "GLOO_DEVICE_TRANSPORT": "TCP", "API_TOKEN": HIDDEN}
    assert "pw" not in str(parts["shown"]) and "tok-123" not in str(parts["shown"])


def test_split_env_makes_every_value_a_string():
    parts = split_env({"PORT": 3128}, {"N": 7})
    assert parts["public"] == {"PORT": "3128"} and parts["secret"] == {"N": "7"}


def test_split_env_of_nothing():
    assert split_env(None, None) == {"public": {}, "secret": {}, "shown": {}}


@pytest.mark.parametrize("name", ["API-TOKEN", "1TOKEN", "A B", ""])
def test_a_secret_name_must_be_a_shell_variable_name(name):
    with pytest.raises(InventoryError) as err:
        check_env({}, {name: "tok-123"}, host="node-1")
    assert err.value.variable == "launch_secret_env" and err.value.host == "node-1"
    assert "tok-123" not in err.value.message


def test_a_name_may_not_be_both_secret_and_open():
    with pytest.raises(InventoryError) as err:
        check_env({"API_TOKEN": "a"}, {"API_TOKEN": "tok-123"})
    assert "API_TOKEN" in err.value.message and err.value.variable == "launch_secret_env"
    assert "tok-123" not in err.value.message


def test_an_open_value_with_credentials_needs_a_shell_name_too():
    with pytest.raises(InventoryError) as err:
        check_env({"my-proxy": "http://u:pw@proxy:3128"}, {}, host="node-2")
    assert err.value.variable == "launch_extra_env" and "pw" not in err.value.message
    check_env({"my-proxy": "http://proxy:3128", "http_proxy": "http://u:pw@proxy:3128"}, {"API_TOKEN": "x"})


def test_a_secret_may_not_replace_what_the_launch_sets():
    with pytest.raises(InventoryError, match="may not override MASTER_ADDR"):
        check_env({}, {"MASTER_ADDR": "10.0.0.9"})
