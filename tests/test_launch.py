"""hf_minitx.launch: the process's place in a launch, read from what accelerate launch (torchrun) sets."""

from hf_minitx.launch import is_first_process, process_count


def test_a_process_started_alone_is_the_first_of_one(monkeypatch):
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    assert process_count() == 1 and is_first_process() and is_first_process(on_this_machine=True)


def test_the_second_machines_first_process_is_first_only_there(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("LOCAL_RANK", "0")
    assert process_count() == 4 and not is_first_process() and is_first_process(on_this_machine=True)
