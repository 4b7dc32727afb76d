"""The ``embedded`` engine: real speech in and out on the CPU, from models shipped in PyPI wheels.

* :mod:`.asr`: pocketsphinx streaming partials and Whisper tiny.en final transcripts.
* :mod:`.tts`: Piper synthesis, sentence by sentence.
* :mod:`.responder`: what the engine says back; :mod:`.tool_router`: which function a caller asks for
  (reading words by :mod:`.tool_words`, :mod:`.tool_utterance` and :mod:`.tool_schema`), and
  :mod:`.tool_reply`: what the function's output says, spoken.
* :mod:`.brain`: what decides a reply (offline by default); :mod:`.llm_brain` with :mod:`.chat_llm`:
  an optional language model behind any OpenAI-compatible endpoint.
* :mod:`.conversation`: a session's history; :mod:`.replies`: its replies while they run.
* :mod:`.engine`: the engine port implementation tying them together.

Importing this package loads no model; :meth:`EmbeddedEngine.start` does. Nor does it import
the engine's modules (they need the ``embedded`` extra): each name below is imported when first
used, so the configuration can read :mod:`.spec` in a core install.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from duplex_gateway.engine.spec import lazy_exports

if TYPE_CHECKING:
    from duplex_gateway.engine.embedded.asr import (
        FinalRecognizer,
        PartialRecognizer,
        PartialRecognizerPool,
        pcm16_to_float32,
        whisper_model_path,
    )
    from duplex_gateway.engine.embedded.brain import Brain, OfflineBrain
    from duplex_gateway.engine.embedded.chat_llm import ChatSettings
    from duplex_gateway.engine.embedded.engine import EmbeddedEngine, EmbeddedModels, EmbeddedSession
    from duplex_gateway.engine.embedded.responder import DIDNT_CATCH, Responder, RestatingResponder
    from duplex_gateway.engine.embedded.tts import (
        PiperSynthesizer,
        default_voice_paths,
        split_sentences,
        voice_sample_rate,
    )

#: Where each exported name lives (imported on first use, PEP 562).
_EXPORTS = {
    "DIDNT_CATCH": "responder",
    "Brain": "brain",
    "ChatSettings": "chat_llm",
    "EmbeddedEngine": "engine",
    "EmbeddedModels": "engine",
    "EmbeddedSession": "engine",
    "FinalRecognizer": "asr",
    "OfflineBrain": "brain",
    "PartialRecognizer": "asr",
    "PartialRecognizerPool": "asr",
    "PiperSynthesizer": "tts",
    "Responder": "responder",
    "RestatingResponder": "responder",
    "default_voice_paths": "tts",
    "pcm16_to_float32": "asr",
    "split_sentences": "tts",
    "voice_sample_rate": "tts",
    "whisper_model_path": "asr",
}

__getattr__ = lazy_exports(__name__, _EXPORTS)


__all__ = [
    "DIDNT_CATCH",
    "Brain",
    "ChatSettings",
    "EmbeddedEngine",
    "EmbeddedModels",
    "EmbeddedSession",
    "FinalRecognizer",
    "OfflineBrain",
    "PartialRecognizer",
    "PartialRecognizerPool",
    "PiperSynthesizer",
    "Responder",
    "RestatingResponder",
    "default_voice_paths",
    "pcm16_to_float32",
    "split_sentences",
    "voice_sample_rate",
    "whisper_model_path",
]
