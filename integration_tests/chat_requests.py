"""Chat requests shared by the structured-output and tool-calling tests of both engines (``test_serve_structured``
on the hf engine, ``vllm/test_vllm_features`` on the vLLM engine): the tools, the question that calls them, and
constraints each engine must refuse with a 400 naming the field, and a pydantic tool asked with every
``tool_choice``."""

import json
from concurrent.futures import ThreadPoolExecutor

import jsonschema

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30},
                                                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                   "required": ["city", "unit"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "The local time in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30}},
                   "required": ["city"], "additionalProperties": False}}}
ASK = [{"role": "user", "content": "What is the weather in Paris? Answer in celsius."}]
#: (extra body, the field its 400 must name)
BAD_CONSTRAINTS = [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "foo"}}}},
     "response_format.json_schema.schema"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "integer", "minimum": 5,
                                                                              "maximum": 1}}}]},
     "tools[0].function.parameters"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
    ({"guided_regex": "[a-"}, "guided_regex"),
]


def ask_a_pydantic_tool_with_every_tool_choice(oai, max_tokens):
    """``openai.pydantic_function_tool`` of a nested model, whose parameters refer to their own ``$defs``: forced
    calls (``required``, named) are read back into the model by the client's ``parse``; ``auto`` calls validate;
    ``none`` answers text."""
    import openai
    from pydantic import BaseModel, Field

    class City(BaseModel):
        name: str = Field(max_length=12)

    class Trip(BaseModel):
        origin: City
        stops: list[City] = Field(max_length=1)

    tool = openai.pydantic_function_tool(Trip)
    ask = dict(model="smollm2", messages=[{"role": "user", "content": "Plan a trip from Paris to Rome."}],
               tools=[tool], max_tokens=max_tokens, temperature=0)
    with ThreadPoolExecutor(2) as pool:
        forced = list(pool.map(lambda choice: oai.chat.completions.parse(**ask, tool_choice=choice).choices[0],
                               ["required", {"type": "function", "function": {"name": "Trip"}}]))
    for answer in forced:
        assert answer.finish_reason == "tool_calls" and answer.message.tool_calls[0].function.name == "Trip"
        assert isinstance(answer.message.tool_calls[0].function.parsed_arguments, Trip)
    auto = oai.chat.completions.create(**{**ask, "max_tokens": 24}, tool_choice="auto").choices[0]
    for call in auto.message.tool_calls or []:
        assert call.function.name == "Trip"
        jsonschema.validate(json.loads(call.function.arguments), tool["function"]["parameters"])
    none = oai.chat.completions.create(**{**ask, "max_tokens": 8}, tool_choice="none").choices[0]
    assert none.message.tool_calls is None and none.message.content
