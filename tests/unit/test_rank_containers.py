import json

from ansible_collections.torchfleet.cluster.plugins.modules.rank_containers import reported_env


def test_a_secret_variable_is_reported_as_its_label_shows_it():
    env = ["RANK=1", "http_proxy=http://u:pw@proxy:3128", "TORCHFLEET_TOKEN=tok-123", "PATH=/usr/bin",
           "no_proxy=10.0.0.0/8"]
    labels = {"torchfleet.secret_env": json.dumps({"http_proxy": "http://***@proxy:3128",
                                                   "TORCHFLEET_TOKEN": "<secret>"})}
    assert reported_env(env, labels) == {"RANK": "1", "http_proxy": "http://***@proxy:3128",
                                         "TORCHFLEET_TOKEN": "<secret>", "no_proxy": "10.0.0.0/8"}


def test_a_container_without_the_label_reports_its_env_as_is():
    assert reported_env(["RANK=0", "GLOO_SOCKET_IFNAME=eth0"], {}) == {"RANK": "0", "GLOO_SOCKET_IFNAME": "eth0"}
