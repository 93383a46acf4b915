"""Stored device profiles (data/device_profiles/*.json) read back for notebook 01's plot."""

import json

import pytest

from batchlab.analysis.device_profiles import load_device_profiles


def write_profile(folder, name, **extra):
    record = {"device": name, "dtype": "bfloat16", "measured_at": "2026-12-01T10:00:00+00:00",
              "bandwidth_Bps": 4.8e12, "peak_flops": 9.9e14,
              "profile": [{"kind": "decode", "batch_size": 8, "ms_per_step": 2.2, "ms_per_token": 0.275},
                          {"kind": "prefill", "batch_size": 1, "ms_per_step": 3.0, "ms_per_token": 0.05},
                          {"kind": "decode", "batch_size": 1, "ms_per_step": 2.0, "ms_per_token": 2.0}]}
    record.update(extra)
    (folder / f"{name.lower().replace(' ', '-')}.json").write_text(json.dumps(record))


def test_profiles_are_read_sorted_with_their_decode_steps(tmp_path):
    write_profile(tmp_path, "NVIDIA L4")
    write_profile(tmp_path, "NVIDIA H200")
    profiles = load_device_profiles(tmp_path)
    assert [p.device for p in profiles] == ["NVIDIA H200", "NVIDIA L4"]
    assert profiles[0].decode.batch_size.tolist() == [1, 8]          # decode rows only, by batch
    assert profiles[0].label == "NVIDIA H200 (bfloat16, stored 2026-12-01)"


def test_no_folder_means_no_profiles(tmp_path):
    assert load_device_profiles(tmp_path / "absent") == []


def test_a_file_that_is_not_a_profile_is_named(tmp_path):
    (tmp_path / "other.json").write_text(json.dumps({"device": "x"}))
    with pytest.raises(ValueError, match=r"other.json: not a device profile"):
        load_device_profiles(tmp_path)
