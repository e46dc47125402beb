// Package pyfmt prints values as CPython prints them: repr of a str
// (WriteStringRepr), repr of a float (FloatRepr), and repr of what
// json.loads makes of a JSON document (ReprJSON: dicts, lists, str, int,
// float, True, False, None). The engines render prompts in Python, and
// some of what they print is a Python repr: a chat template printing None
// or a list, vLLM's Anthropic conversion printing an assistant
// tool_result's content list with str(). The template values
// (pkg/tokenize), the request converter (pkg/openai) and the engine
// simulator's vLLM-worded errors (cmd/enginesim) print through it. It is
// pure: no state, no goroutines.
package pyfmt
