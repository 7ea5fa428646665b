import multiprocessing
from typing import Any

import pytest

from omnivoice.config import Profile, ProfileError, load_profile, parse_profile


def test_defaults_are_the_cpu_profile() -> None:
    p = Profile()
    assert p.model.path is None
    assert p.stages.code2wav.chunk.first_frames == 4
    assert p.stages.code2wav.chunk.frames == 25
    assert p.stages.code2wav.chunk.left_context == 25
    assert p.stages.stage("talker") is p.stages.talker


def test_unknown_key_is_named() -> None:
    with pytest.raises(ProfileError, match=r"stages\.talker\.max_btach: unknown key"):
        parse_profile({"stages": {"talker": {"max_btach": 4}}})


def test_ill_typed_value_is_named() -> None:
    with pytest.raises(ProfileError, match=r"server\.port"):
        parse_profile({"server": {"port": "eighty"}})


def test_chunk_sizes_are_checked() -> None:
    with pytest.raises(ProfileError, match="first_frames"):
        parse_profile({"stages": {"code2wav": {"chunk": {"first_frames": 30, "frames": 25}}}})


def test_load_profile_reports_bad_yaml_and_missing_files(tmp_path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("stages: [unclosed")
    with pytest.raises(ProfileError, match="not valid YAML"):
        load_profile(bad)
    with pytest.raises(ProfileError, match="cannot read"):
        load_profile(tmp_path / "missing.yaml")
    assert load_profile(None) == Profile()


def test_the_speculative_response_is_on_by_default_and_can_be_turned_off() -> None:
    assert Profile().realtime.speculative_response is True
    assert parse_profile({"realtime": {"speculative_response": False}}).realtime.speculative_response is False
    with pytest.raises(ProfileError, match=r"realtime\.speculative_responses: unknown key"):
        parse_profile({"realtime": {"speculative_responses": False}})


def test_stage_processes_are_forked_from_a_forkserver_by_default_where_there_is_one() -> None:
    def method(**keys: Any) -> str:
        return parse_profile({"stages": keys}).stages.process_start_method()

    assert "forkserver" in multiprocessing.get_all_start_methods()  # the platforms the tests run on
    assert method() == "forkserver"
    assert method(start_method="spawn") == "spawn"
    with pytest.raises(ProfileError, match=r"stages\.start_method"):
        parse_profile({"stages": {"start_method": "fork"}})  # fork: not offered (CUDA, threads)


def test_capacity_calibration_is_on_by_default_only_for_a_cuda_thinker() -> None:
    def stages(**keys: Any) -> Any:
        return parse_profile({"stages": keys}).stages

    assert not stages().calibrates()
    assert not stages(warm_burst=True).calibrates()  # a CPU warm-up burst does not calibrate
    cuda = {"device": "cuda:0"}
    assert stages(thinker=cuda).calibrates()
    assert not stages(thinker=cuda, capacity={"calibrate": False}).calibrates()
    assert not stages(thinker=cuda, capacity={"enabled": False}).calibrates()  # nothing to admit by
    assert stages(capacity={"calibrate": True}).calibrates()
