from ansible_collections.torchfleet.cluster.plugins.module_utils import loader_libraries

# `ldconfig -p` in the training image (Debian bookworm, x86_64), cut down.
LISTING = """1169 libs found in cache `/etc/ld.so.cache'
\tlibz.so.1 (libc6,x86-64) => /lib/x86_64-linux-gnu/libz.so.1
\tlibtcmalloc.so.4 (libc6,x86-64) => /lib/x86_64-linux-gnu/libtcmalloc.so.4
\tlibtcmalloc.so.4 (libc6) => /lib/i386-linux-gnu/libtcmalloc.so.4
\tlibjemalloc.so.2 (libc6,x86-64) => /lib/x86_64-linux-gnu/libjemalloc.so.2
"""


def test_the_listing_gives_each_soname_its_first_path():
    found = loader_libraries.parse(LISTING)
    assert found["libtcmalloc.so.4"] == "/lib/x86_64-linux-gnu/libtcmalloc.so.4"
    assert found["libjemalloc.so.2"] == "/lib/x86_64-linux-gnu/libjemalloc.so.2"
    assert "1169 libs found in cache `/etc/ld.so.cache'" not in found


def test_an_answer_names_the_missing_library_and_the_loaders_error():
    assert loader_libraries.answer(["libjemalloc.so.2", "libfoo.so.1"], loader_libraries.parse(LISTING)) == {
        "libjemalloc.so.2": "/lib/x86_64-linux-gnu/libjemalloc.so.2", "libfoo.so.1": None}
    assert loader_libraries.answer(["libtcmalloc.so.4"], {}, "ldconfig not found") == {
        "libtcmalloc.so.4": None, "error": "ldconfig not found"}
