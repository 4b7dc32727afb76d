"""The vLLM-Omni engines' pure parts, and their wiring into config, CLI and registry.

These need neither vLLM nor vLLM-Omni and run in every virtualenv.
"""

from __future__ import annotations

import io
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from duplex_gateway.config import ConfigError, load_settings
from duplex_gateway.engine.registry import ENGINES, build_engine
from duplex_gateway.engine.vllm_omni import (
    OmniFactoryError,
    ReplyAudio,
    VllmOmniEngine,
    decode_audio,
    keep_root_logging,
    load_factory,
)
from duplex_gateway.engine.vllm_omni_stream import AudioCursor, TextCursor, VllmOmniStreamEngine, to_mono


def _signal(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-0.5, 0.5, n).astype(np.float32)


# -- cumulative or delta audio ---------------------------------------------------------------


@pytest.mark.parametrize("prior", [True, False])
def test_audio_cursor_takes_cumulative_outputs_apart(prior: bool) -> None:
    audio = _signal(3000)
    cursor = AudioCursor(cumulative_prior=prior)
    pieces = [cursor.new_samples(audio[:n]) for n in (1000, 2000, 3000, 3000)]
    assert [p.size for p in pieces] == [1000, 1000, 1000, 0]
    assert np.array_equal(np.concatenate(pieces), audio)
    assert cursor.cumulative is True


@pytest.mark.parametrize("prior", [True, False])
def test_audio_cursor_passes_deltas_through(prior: bool) -> None:
    audio = _signal(3000)
    cursor = AudioCursor(cumulative_prior=prior)
    chunks = [audio[:1000], audio[1000:2500], audio[2500:]]
    pieces = [cursor.new_samples(c) for c in chunks]
    assert all(np.array_equal(p, c) for p, c in zip(pieces, chunks, strict=True))
    assert cursor.cumulative is False


def test_audio_cursor_delta_shorter_than_the_past_is_a_delta() -> None:
    cursor = AudioCursor(cumulative_prior=True)
    cursor.new_samples(_signal(2000))
    chunk = _signal(500, seed=1)
    assert np.array_equal(cursor.new_samples(chunk), chunk)
    assert cursor.cumulative is False


@pytest.mark.parametrize("prior", [True, False])
def test_audio_cursor_silence_cannot_tell_so_the_prior_decides(prior: bool) -> None:
    cursor = AudioCursor(cumulative_prior=prior)
    cursor.new_samples(np.zeros(800, dtype=np.float32))
    out = cursor.new_samples(np.zeros(1600, dtype=np.float32))
    assert out.size == (800 if prior else 1600)
    assert cursor.cumulative is prior


def test_to_mono_flattens_tensors_lists_and_arrays() -> None:
    class Tensor:  # duck-typed like torch.Tensor
        def __init__(self, data: np.ndarray) -> None:
            self.data = data

        def detach(self) -> Tensor:
            return self

        def float(self) -> Tensor:
            return self

        def cpu(self) -> Tensor:
            return self

        def numpy(self) -> np.ndarray:
            return self.data

    a, b = _signal(10), _signal(5, seed=2)
    assert np.array_equal(to_mono([Tensor(a.reshape(1, -1)), b]), np.concatenate([a, b]))
    assert to_mono(None).size == 0
    assert to_mono([]).size == 0


def test_text_cursor_cumulative_and_delta() -> None:
    cumulative = TextCursor()
    assert [cumulative.new_text(t, cumulative=True) for t in ("(ec", "(echo", "(echo", "(echo of")] == [
        "(ec",
        "ho",
        "",
        " of",
    ]
    delta = TextCursor()
    assert [delta.new_text(t, cumulative=False) for t in ("ab", "ab", "c")] == ["ab", "ab", "c"]
    unknown = TextCursor()
    assert [unknown.new_text(t, cumulative=None) for t in ("ab", "abc", "d")] == ["ab", "c", "d"]


# -- engine audio to the gateway --------------------------------------------------------------


def test_decode_audio_formats() -> None:
    samples = _signal(480)
    pcm16 = (samples * 32767).astype("<i2").tobytes()
    for fmt in ("pcm16", "pcm", "s16le", None):
        out, rate = decode_audio(pcm16, fmt, 24_000)
        assert rate == 24_000 and np.allclose(out, samples, atol=1e-4)
    out, rate = decode_audio(samples.astype("<f4").tobytes(), "pcm_f32le", 16_000)
    assert rate == 16_000 and np.allclose(out, samples)
    wav = io.BytesIO()
    sf.write(wav, samples, 22_050, format="WAV", subtype="PCM_16")
    out, rate = decode_audio(wav.getvalue(), "wav", None)
    assert rate == 22_050 and np.allclose(out, samples, atol=1e-4)
    out, rate = decode_audio(bytes([0xFF] * 80), "g711_ulaw", None)
    assert rate == 8_000 and out.size == 80
    with pytest.raises(ValueError):
        decode_audio(b"\0\0", "mp3", None)


def test_reply_audio_resamples_a_stream_and_counts_what_it_produced() -> None:
    reply = ReplyAudio(24_000)
    pieces = [reply.convert(_signal(1600, seed=i), 16_000) for i in range(10)]
    pcm = b"".join(pieces) + reply.flush()
    assert len(pcm) // 2 == 24_000  # 1 s of 16 kHz -> 1 s of 24 kHz, once flushed
    assert reply.produced_ms == 1000
    same = ReplyAudio(24_000)
    assert len(same.convert(_signal(2400), 24_000)) == 4800  # no resampling: nothing held back


def test_keep_root_logging_restores_levels() -> None:
    import logging

    root = logging.getLogger()
    before = root.level
    with keep_root_logging():
        root.setLevel(logging.ERROR)
    assert root.level == before


# -- factory, config, CLI, registry -------------------------------------------------------------


def test_load_factory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "omni_factory_mod.py").write_text("def make():\n    return 42\nvalue = 1\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delitem(sys.modules, "omni_factory_mod", raising=False)
    assert load_factory("omni_factory_mod:make")() == 42
    for bad in (
        "omni_factory_mod",
        "omni_factory_mod:missing",
        "omni_factory_mod:value",
        "no_such_module_xyz:f",
    ):
        with pytest.raises(OmniFactoryError):
            load_factory(bad)


def test_settings_and_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    from duplex_gateway.engine import vllm_omni_spec

    monkeypatch.setattr(vllm_omni_spec, "vllm_omni_installed", lambda: True)
    assert {"vllm-omni", "vllm-omni-stream"} <= set(ENGINES)
    settings = load_settings(
        **{
            "engine.name": "vllm-omni",
            "engine.vllm_omni.omni_factory": "tests.omni.fake_stage:duplex_omni",
            "engine.vllm_omni.output_rate": 22_050,
        }
    )
    engine = build_engine(settings)
    assert isinstance(engine, VllmOmniEngine)
    assert engine.capabilities.output_rate == 22_050 and engine.capabilities.input_rate == 16_000
    assert not engine.ready and engine.active_sessions == 0
    stream = build_engine(
        load_settings(**{"engine.name": "vllm-omni-stream", "engine.vllm_omni.model": "Qwen/Qwen2.5-Omni-7B"})
    )
    assert isinstance(stream, VllmOmniStreamEngine) and not stream.capabilities.detects_turns
    engine_vad = build_engine(
        load_settings(
            **{
                "engine.name": "vllm-omni",
                "engine.vllm_omni.model": "m",
                "engine.vllm_omni.turn_detection": "engine",
            }
        )
    )
    assert engine_vad.capabilities.detects_turns
    with pytest.raises(ConfigError, match="engine.vllm_omni.model"):
        build_engine(load_settings(**{"engine.name": "vllm-omni"}))
    with pytest.raises(ConfigError, match="omni_factory"):
        load_settings(**{"engine.vllm_omni.omni_factory": "not a spec"})


def test_without_vllm_omni_the_error_says_how_to_get_it(monkeypatch: pytest.MonkeyPatch) -> None:
    from duplex_gateway.engine import vllm_omni_spec

    monkeypatch.setattr(vllm_omni_spec, "vllm_omni_installed", lambda: False)
    for name in ("vllm-omni", "vllm-omni-stream"):
        with pytest.raises(ConfigError, match="make omni-venv"):
            build_engine(load_settings(**{"engine.name": name, "engine.vllm_omni.model": "m"}))


def test_cli_flags_reach_the_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    from duplex_gateway import cli

    seen = {}

    def fake_serve(args: object) -> int:
        seen.update(vars(args))
        return 0

    monkeypatch.setattr(cli, "_serve", fake_serve)
    argv = [
        "serve",
        "--engine",
        "vllm-omni",
        "--model",
        "M",
        "--deploy-config",
        "d.yaml",
        "--omni-factory",
        "a.b:c",
    ]
    assert cli.main(argv) == 0
    assert (seen["model"], seen["deploy_config"], seen["omni_factory"]) == ("M", "d.yaml", "a.b:c")


def test_cli_without_a_model_says_which_key(capsys: pytest.CaptureFixture[str]) -> None:
    from duplex_gateway import cli

    assert cli.main(["serve", "--engine", "vllm-omni-stream"]) == 2
    assert "--omni-factory" in capsys.readouterr().err


def test_engines_refuse_sessions_before_start() -> None:
    import asyncio

    from duplex_gateway.engine import port
    from duplex_gateway.vocabulary.session_config import SessionConfig

    async def scenario() -> None:
        for engine in (VllmOmniEngine(model="m"), VllmOmniStreamEngine(model="m")):
            with pytest.raises(port.EngineUnavailable):
                await engine.open_session("s", SessionConfig())
            await engine.shutdown()

    asyncio.run(scenario())
