"""The Responses API's store keeps the newest responses within both of its bounds."""

from lmi_tools.serving.response_store import ResponseStore, Stored


def stored(characters: int) -> Stored:
    return Stored({"status": "completed"}, [{"role": "user", "content": "x" * characters}])


def test_the_oldest_responses_go_first_beyond_either_bound():
    store = ResponseStore(max_responses=3, max_characters=100)
    for i in range(4):
        store.put(f"r{i}", stored(10))
    assert [store.get(f"r{i}") is not None for i in range(4)] == [False, True, True, True]
    store.put("big", stored(85))  # 10 + 10 + 10 + 85 > 100: the two oldest go
    assert [store.get(k) is not None for k in ("r1", "r2", "r3", "big")] == [False, False, True, True]
    store.put("huge", stored(500))  # alone beyond the bound: kept, as the newest, and everything else goes
    assert store.get("huge") is not None and store.get("big") is None
    assert store.delete("huge") and not store.delete("huge") and store.get("huge") is None


def test_replacing_a_response_counts_its_new_size_only():
    store = ResponseStore(max_responses=10, max_characters=50)
    store.put("a", stored(30))
    store.put("a", stored(40))  # the in-progress entry replaced by the finished one
    store.put("b", stored(10))
    assert store.get("a") is not None and store.get("b") is not None
