"""Tool calls written in text, and invented tool results, found by ``agent.llm.toolcalls``."""

from __future__ import annotations

import json

import pytest

from sleuth.agent.llm.toolcalls import RESULT_KEYS, extract_tool_calls

TOOLS = {"generate_and_classify", "caption_failures", "perturb_caption", "edit_image", "measure_rate",
         "record_finding", "finish"}
DOG_ROAD = "a realistic photograph of a dog. it is on the road."


def args(call) -> dict:
    assert call.valid, call.arguments
    return json.loads(call.arguments)


def test_fenced_json_call_with_reasoning_around_it():
    reply = ("First I measure the baseline of the class prompt.\n\n```json\n"
             '{"name": "generate_and_classify", "arguments": {"prompt": "a realistic photograph of a dog", "n": 300}}'
             "\n```\n\nThen I will caption the failures.")
    out = extract_tool_calls(reply, TOOLS)
    assert [(c.name, c.source) for c in out.calls] == [("generate_and_classify", "fence")]
    assert args(out.calls[0]) == {"prompt": "a realistic photograph of a dog", "n": 300}
    assert out.text == "First I measure the baseline of the class prompt.\n\nThen I will caption the failures."
    assert not out.invented_result and out.stripped == []


def test_tool_call_tags_several_calls_and_an_unclosed_last_one():
    reply = ('<tool_call>\n{"name": "measure_rate", "arguments": {"caption": "' + DOG_ROAD + '", "max_n": 200}}\n'
             '</tool_call>\n<tool_call>\n{"name": "measure_rate", "arguments": {"caption": "a watercolour of a '
             'dog.", "target_label": "fox"}}')
    out = extract_tool_calls(reply, TOOLS)
    assert [c.name for c in out.calls] == ["measure_rate", "measure_rate"]
    assert args(out.calls[0]) == {"caption": DOG_ROAD, "max_n": 200}
    assert args(out.calls[1]) == {"caption": "a watercolour of a dog.", "target_label": "fox"}
    assert out.text == ""


def test_a_call_cut_off_by_the_token_limit_is_passed_on_as_invalid():
    reply = 'I test the road.\n<tool_call>\n{"name": "measure_rate", "arguments": {"caption": "a realistic pho'
    out = extract_tool_calls(reply, TOOLS)
    assert len(out.calls) == 1 and out.calls[0].name == "measure_rate" and not out.calls[0].valid
    assert out.calls[0].arguments.startswith('{"name": "measure_rate"')
    assert out.text == "I test the road."


def test_bare_objects_openai_shape_parameters_and_string_arguments():
    reply = ('I will caption the failures {"name": "caption_failures", "parameters": {"measurement_id": "m1"}} and '
             'then {"type": "function", "function": {"name": "perturb_caption", "arguments": '
             '"{\\"caption\\": \\"' + DOG_ROAD + '\\", \\"n\\": 2}"}} and also '
             '{"function": "finish", "arguments": {"summary": "done"}}.')
    out = extract_tool_calls(reply, TOOLS)
    assert [(c.name, c.source) for c in out.calls] == [("caption_failures", "bare"), ("perturb_caption", "bare"),
                                                       ("finish", "bare")]
    assert args(out.calls[0]) == {"measurement_id": "m1"}
    assert args(out.calls[1]) == {"caption": DOG_ROAD, "n": 2}
    assert args(out.calls[2]) == {"summary": "done"}
    assert out.text == "I will caption the failures  and then  and also ."


def test_a_json_array_of_calls_in_one_fence():
    reply = ('```json\n[{"name": "measure_rate", "arguments": {"caption": "' + DOG_ROAD + '"}},\n'
             ' {"name": "measure_rate", "arguments": {"caption": "a painting of a dog."}}]\n```')
    out = extract_tool_calls(reply, TOOLS)
    assert [args(c)["caption"] for c in out.calls] == [DOG_ROAD, "a painting of a dog."]


def test_unknown_names_are_reported_not_called_and_prefixes_are_dropped():
    reply = ('<tool_call>{"name": "functions.measure_rate", "arguments": {"caption": "a dog."}}</tool_call>'
             '<tool_call>{"name": "measure", "arguments": {"caption": "a dog."}}</tool_call>')
    out = extract_tool_calls(reply, TOOLS)
    assert [c.name for c in out.calls] == ["measure_rate"]
    assert [c.name for c in out.unknown] == ["measure"]


def test_plain_data_and_echoed_schemas_are_not_calls():
    reply = ('The labels include {"name": "dog"} and the config was {"n": 300}. The schema reads '
             '{"name": "measure_rate", "parameters": {"type": "object", "properties": {"caption": {}}}}')
    out = extract_tool_calls(reply, TOOLS)
    assert out.calls == [] and out.unknown == []
    assert out.text == reply


def test_python_literals_are_read_leniently():
    reply = "<tool_call>\n{'name': 'measure_rate', 'arguments': {'caption': 'a dog.', 'confirm': True}}\n</tool_call>"
    out = extract_tool_calls(reply, TOOLS)
    assert args(out.calls[0]) == {"caption": "a dog.", "confirm": True}


def test_function_tags():
    reply = '<function=measure_rate>{"caption": "a dog.", "max_n": 100}</function>'
    out = extract_tool_calls(reply, TOOLS)
    assert [(c.name, args(c)) for c in out.calls] == [("measure_rate", {"caption": "a dog.", "max_n": 100})]


# -- invented results ------------------------------------------------------------------------------------------


def test_an_invented_result_block_and_the_calls_after_it_are_cut():
    reply = ('I measure the road hypothesis.\n<tool_call>\n{"name": "measure_rate", "arguments": {"caption": "'
             + DOG_ROAD + '"}}\n</tool_call>\n<tool_response>\n{"test_id": "t1", "verdict": "supported", '
             '"adjusted_p": 0.001}\n</tool_response>\nIt is supported, so I confirm it.\n<tool_call>\n'
             '{"name": "record_finding", "arguments": {"caption": "' + DOG_ROAD + '", "discovery_test": "t1", '
             '"confirmation_test": "t2", "summary": "x"}}\n</tool_call>')
    out = extract_tool_calls(reply, TOOLS)
    assert [c.name for c in out.calls] == ["measure_rate"]
    assert [c.name for c in out.dropped_calls] == ["record_finding"]
    assert out.text == "I measure the road hypothesis."
    assert out.invented_result.startswith("<tool_response>") and "It is supported" in out.invented_result
    assert out.stripped == ["invented_result", "calls_after_invented_result"]


def test_a_words_only_reply_that_is_an_invented_measurement():
    reply = ('The measurement returned:\n```json\n{"test_id": "t3", "caption": "' + DOG_ROAD + '", "hypothesis": '
             '{"failures": {"k": 40, "n": 100}}, "p_value": 0.0001, "verdict": "supported"}\n```\nThe dog on the '
             'road is a confirmed failure.')
    out = extract_tool_calls(reply, TOOLS)
    assert out.calls == []
    assert out.text == "The measurement returned:"
    assert '"verdict": "supported"' in out.invented_result and out.stripped == ["invented_result"]


def test_result_lines_after_a_call_are_invented_but_not_before():
    before = "Result: the baseline failed on 12/300 images, so I caption them.\n"
    call = '```json\n{"name": "caption_failures", "arguments": {"measurement_id": "m1"}}\n```\n'
    out = extract_tool_calls(before + call + "Result: 3 hypotheses were found.", TOOLS)
    assert [c.name for c in out.calls] == ["caption_failures"]
    assert out.text == before.strip()
    assert out.invented_result == "Result: 3 hypotheses were found."


def test_output_fences_and_simulated_turns_are_invented():
    call = '<tool_call>{"name": "finish", "arguments": {"summary": "no findings"}}</tool_call>'
    out = extract_tool_calls(call + "\n```output\nfinished\n```", TOOLS)
    assert [c.name for c in out.calls] == ["finish"] and out.invented_result == "```output\nfinished\n```"
    out = extract_tool_calls(call + "\n<|im_start|>user\nthanks", TOOLS)
    assert out.invented_result == "<|im_start|>user\nthanks"


def test_a_call_carrying_its_own_result_keeps_the_call():
    reply = '{"name": "measure_rate", "arguments": {"caption": "a dog."}, "result": {"verdict": "supported"}} ok'
    out = extract_tool_calls(reply, TOOLS)
    assert [c.name for c in out.calls] == ["measure_rate"]
    assert out.invented_result == "ok" and out.stripped == ["invented_result"]


def test_a_reply_without_calls_or_results_is_left_alone():
    reply = "The baseline is low: 4/300 [0.5%, 3.4%]. I will now look at the failures."
    out = extract_tool_calls(reply, TOOLS)
    assert out.calls == [] and out.text == reply and out.stripped == []


@pytest.mark.parametrize("reply", ["", "{", "```json\n{\n```", "<tool_call>", "<tool_call></tool_call>", "[[[", "}{"])
def test_degenerate_replies_do_not_raise(reply):
    out = extract_tool_calls(reply, TOOLS)
    assert out.calls == []


def test_result_keys_match_the_registry():
    """Every tool's result has a key that marks it as a result, and no tool argument is such a key (a call's
    arguments must never look like a result)."""
    from sleuth.tools import investigation_tools as registry

    reg = registry()
    arg_names = {f for name in reg.names() for f in reg.get(name).args_model.model_fields}
    assert not arg_names & RESULT_KEYS
    for name in reg.names():
        fields = set(reg.get(name).result_model.model_fields)
        assert fields & RESULT_KEYS, name


def test_python_style_calls_in_a_code_block():
    reply = ("I will measure two captions.\n```python\nr1 = measure_rate(caption=\"" + DOG_ROAD + "\", max_n=200)\n"
             "measure_rate(caption='a painting of a dog.', confirm=False)\nprint(r1)\n```")
    out = extract_tool_calls(reply, TOOLS)
    assert [args(c) for c in out.calls] == [{"caption": DOG_ROAD, "max_n": 200},
                                            {"caption": "a painting of a dog.", "confirm": False}]
    assert out.text == "I will measure two captions."
    # Code that does anything else is left as text: it is no call.
    other = "```python\nimport os\nmeasure_rate(caption='a dog.')\n```"
    assert extract_tool_calls(other, TOOLS).calls == []


# -- replies of the real model ---------------------------------------------------------------------------------
# Qwen2.5-Coder-1.5B-Instruct (Q4_K_M) behind llama.cpp's llama-server --jinja, temperature 0, sent sleuth's
# system prompt, tool schemas and task for the class "fox" (docs/llm.md). The server returned these as content with
# no tool_calls.

QWEN_FIRST_TURN = ('```json\n{\n  "name": "generate_and_classify",\n  "arguments": {\n    "prompt": "a realistic '
                   'photograph of a fox",\n    "n": 100,\n    "target_label": "fox"\n  }\n}\n```')


def test_the_real_models_fenced_first_call():
    out = extract_tool_calls(QWEN_FIRST_TURN, TOOLS)
    assert [(c.name, c.source) for c in out.calls] == [("generate_and_classify", "fence")]
    assert args(out.calls[0]) == {"prompt": "a realistic photograph of a fox", "n": 100, "target_label": "fox"}
    assert out.text == "" and out.stripped == []


def test_doubled_braces_copied_from_the_chat_templates_example():
    # Qwen2.5-Coder's template shows the call format as {{"name": <function-name>, "arguments": <args-json-object>}}.
    reply = '<tool_call>\n{{"name": "caption_failures", "arguments": {"measurement_id": "m1"}}}\n</tool_call>'
    out = extract_tool_calls(reply, TOOLS)
    assert [(c.name, args(c)) for c in out.calls] == [("caption_failures", {"measurement_id": "m1"})]


def test_the_real_models_words_only_second_turn_is_neither_call_nor_result():
    # After a real baseline result, sent back in the template's own <tool_response> format: a conclusion in words,
    # with no call (the planner must treat it as a malformed turn and ask for a call).
    reply = 'I find that the classifier fails on the class "fox" when the prompt is "a realistic photograph of a fox".'
    out = extract_tool_calls(reply, TOOLS)
    assert out.calls == [] and out.unknown == [] and out.text == reply and out.stripped == []


def test_the_real_models_reply_under_tool_choice_required():
    # tool_choice="required" did not make it write <tool_call>: the grammar only kept it from stopping, so it wrote
    # its fenced call and then newlines until max_tokens (finish_reason "length").
    out = extract_tool_calls(QWEN_FIRST_TURN + "\n" * 60, TOOLS)
    assert [c.name for c in out.calls] == ["generate_and_classify"] and out.text == ""


def test_the_real_models_reply_under_a_json_schema_grammar():
    # response_format json_schema {"call": oneOf(tools), "reasoning": string}, no tools parameter: a valid call.
    reply = ('{\n  "call": {\n    "name": "generate_and_classify",\n    "arguments": {\n      "prompt": "a realistic '
             'photograph of a fox in the snow",\n      "n": 100,\n      "target_label": "fox"\n    }\n  },\n  '
             '"reasoning": "To find the conditions under which the classifier fails on the class \'fox\', we generate '
             '100 images from the prompt \'a realistic photograph of a fox in the snow\'"\n}')
    out = extract_tool_calls(reply, TOOLS)
    assert [(c.name, c.source) for c in out.calls] == [("generate_and_classify", "bare")]
    assert args(out.calls[0])["prompt"] == "a realistic photograph of a fox in the snow"


def test_the_real_models_call_on_a_minimal_one_tool_request():
    reply = '```json\n{\n  "name": "get_time",\n  "arguments": {\n    "city": "Paris"\n  }\n}\n```'
    out = extract_tool_calls(reply, {"get_time"})
    assert [(c.name, args(c)) for c in out.calls] == [("get_time", {"city": "Paris"})]
