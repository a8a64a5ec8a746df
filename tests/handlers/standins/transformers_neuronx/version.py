"""The transformers-neuronx release whose API this stand-in reproduces (LMI 0.29 / Neuron SDK 2.19.1)."""

__version__ = "0.11.351"
#: Lets code and tests tell the stand-in from the real library.
IS_STANDIN = True
