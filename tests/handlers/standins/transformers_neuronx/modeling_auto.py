"""``NeuronAutoModelForCausalLM``: pick the class from the checkpoint's ``model_type``."""

from . import models

NEURON_MODEL_FOR_CAUSAL_LM_MAPPING = {
    "bloom": models.BloomForSampling,
    "code_llama": models.LlamaForSampling,
    "gpt2": models.GPT2ForSamplingWithContextBroadcasting,
    "gpt_neox": models.GPTNeoXForSampling,
    "gptj": models.GPTJForSampling,
    "llama": models.LlamaForSampling,
    "mistral": models.MistralForSampling,
    "mixtral": models.MixtralForSampling,
    "opt": models.OPTForSampling,
}


class NeuronAutoModelForCausalLM:
    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *model_args, **kwargs):
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(pretrained_model_name_or_path)
        model_type = getattr(config, "model_type", None)
        if model_type is None:
            raise AssertionError(f"Models based on '{type(config)}' are not supported by Neuron")
        if model_type not in NEURON_MODEL_FOR_CAUSAL_LM_MAPPING:
            raise AssertionError(f"The configuration model type '{model_type}' is not supported by Neuron")
        model_class = NEURON_MODEL_FOR_CAUSAL_LM_MAPPING[model_type]
        return model_class.from_pretrained(pretrained_model_name_or_path, *model_args, **kwargs)
