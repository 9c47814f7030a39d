import pytest

from agent.plugins.base import PluginError
from agent.plugins.moshi_defaults import DEFAULT_PERSONA
from agent.plugins.personaplex import policy

VOICES = ("NATF2.pt", "NATM1.pt")


def test_default_voice_when_none_given() -> None:
    assert policy.validate_voice(None, VOICES, "NATF2.pt") == "NATF2.pt"
    assert policy.validate_voice("", VOICES, "NATF2.pt") == "NATF2.pt"
    assert policy.validate_voice("NATM1.pt", VOICES, "NATF2.pt") == "NATM1.pt"


@pytest.mark.parametrize(
    "name",
    ["../NATF2.pt", "voices/NATF2.pt", "/abs/NATF2.pt", "..\\NATF2.pt", "NATF2", "NATF2.wav",
     ".pt", "..pt", "NAT F2.pt", "NATF2.pt\x00", "C:NATF2.pt", "NATX9.pt"],
)
def test_bad_voice_names_are_invalid_voice(name: str) -> None:
    with pytest.raises(PluginError) as err:
        policy.validate_voice(name, VOICES, "NATF2.pt")
    assert err.value.code == "invalid_voice"
    assert err.value.param == "session.voice"


def test_persona_default_and_wrap() -> None:
    assert policy.persona_instructions(None) == DEFAULT_PERSONA
    assert policy.persona_instructions("   ") == DEFAULT_PERSONA
    assert policy.persona_instructions("  Be a pirate. ") == "Be a pirate."
    assert policy.wrap_persona("  Be a pirate.\n") == "<system> Be a pirate. <system>"
    # Already wrapped (as NVIDIA's wrap_with_system_tags): left as it is, only stripped.
    wrapped = "<system> Be a pirate. <system>"
    assert policy.wrap_persona(f" {wrapped} ") == wrapped


def test_persona_too_long_is_refused() -> None:
    with pytest.raises(PluginError) as err:
        policy.persona_instructions("x" * (policy.MAX_PERSONA_CHARS + 1))
    assert err.value.code == "invalid_instructions"


def test_private_and_client_keys_do_not_overlap() -> None:
    assert policy.PRIVATE_EXTRA_BODY_KEYS.isdisjoint(policy.CLIENT_EXTRA_BODY_KEYS)
    assert "model_dir" in policy.PRIVATE_EXTRA_BODY_KEYS


def test_sampling_defaults_to_greedy() -> None:
    options = policy.sampling_options({}, card=2048, text_card=32000)
    assert options == policy.SamplingOptions()
    assert options.use_sampling is False


def test_sampling_options_parsed() -> None:
    options = policy.sampling_options(
        {"sampling": True, "temperature": 1, "top_k": 10, "top_k_text": 5, "seed": 42,
         "temperature_text": 0.5},
        card=2048, text_card=100,
    )
    assert options == policy.SamplingOptions(True, 1.0, 0.5, 10, 5, 42)


def test_top_k_default_clamped_to_small_vocab() -> None:
    options = policy.sampling_options({"sampling": True}, card=2048, text_card=20)
    assert options.top_k_text == 20


@pytest.mark.parametrize(
    "extra_body, param",
    [
        ({"sampling": "yes"}, "extra_body.sampling"),
        ({"sampling": True, "temperature": 0}, "extra_body.temperature"),
        ({"sampling": True, "temperature": float("nan")}, "extra_body.temperature"),
        ({"sampling": True, "temperature": "hot"}, "extra_body.temperature"),
        ({"sampling": True, "top_k": 0}, "extra_body.top_k"),
        ({"sampling": True, "top_k": 5000}, "extra_body.top_k"),
        ({"sampling": True, "top_k": 2.5}, "extra_body.top_k"),
        ({"sampling": True, "top_k_text": True}, "extra_body.top_k_text"),
        ({"sampling": True, "seed": -1}, "extra_body.seed"),
        ({"temperature": 0.9}, "extra_body.temperature"),
        ({"seed": 3}, "extra_body.seed"),
    ],
)
def test_bad_sampling_options_are_invalid_option(extra_body: dict, param: str) -> None:
    with pytest.raises(PluginError) as err:
        policy.sampling_options(extra_body, card=2048, text_card=32000)
    assert err.value.code == "invalid_option"
    assert err.value.param == param


def test_update_errors() -> None:
    assert policy.voice_update_unsupported("personaplex").code == "voice_update_unsupported"
    assert policy.persona_update_unsupported("moshi").code == "persona_update_unsupported"


def test_sampling_presets_by_name_and_as_the_servers_default() -> None:
    reference = policy.sampling_options({"sampling": "reference"}, card=2048, text_card=32000)
    # NVIDIA's server defaults (its LMGen: temp 0.8 / 0.7, top-k 250 / 25, sampling on).
    assert (reference.use_sampling, reference.temperature, reference.temperature_text,
            reference.top_k, reference.top_k_text) == (True, 0.8, 0.7, 250, 25)
    assert not policy.sampling_options({"sampling": "greedy"}, 2048, 32000).use_sampling
    assert policy.sampling_options({}, 2048, 32000, default="reference").use_sampling
    # A call still chooses for itself on a server whose default is the reference preset.
    assert not policy.sampling_options({"sampling": False}, 2048, 32000,
                                       default="reference").use_sampling
    with pytest.raises(PluginError) as refused:
        policy.sampling_options({"sampling": "creative"}, 2048, 32000)
    assert refused.value.param == "extra_body.sampling"
