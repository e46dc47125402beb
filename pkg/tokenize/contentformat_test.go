package tokenize

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
)

// The expected answers are what vLLM 0.33's own detection
// (renderers/hf.py _detect_content_format) gives for each template: its
// functions were run on these sources with jinja2 and transformers.
func TestLoopsOverContentAsVLLMDetects(t *testing.T) {
	for _, c := range []struct {
		name, src string
		parts     bool
	}{
		{"plain_for_content", `{% for message in messages %}{% for part in message['content'] %}{{ part.text }}{% endfor %}{% endfor %}`, true},
		{"attr", `{% for m in messages %}{% for p in m.content %}{{ p }}{% endfor %}{% endfor %}`, true},
		{"alias_slice", `{% set loop_messages = messages[1:] %}{% for message in loop_messages %}{% for c in message.content | selectattr('type','equalto','text') %}{{ c.text }}{% endfor %}{% endfor %}`, true},
		{"alias_index_not", `{% set first = messages[0] %}{% for message in first %}{% for c in message.content %}{{ c }}{% endfor %}{% endfor %}`, false},
		{"ns_alias", `{% set ns = namespace(rest=messages) %}{% for m in ns.rest %}{% for c in m['content'] %}{{ c }}{% endfor %}{% endfor %}`, true},
		{"ns_assign", `{% set ns = namespace(x=1) %}{% set ns.rest = messages[1:] %}{% for m in ns.rest %}{% for c in m.content %}{{ c }}{% endfor %}{% endfor %}`, true},
		{"content_name", `{% for message in messages %}{% set content = message.content %}{% for c in content %}{{ c }}{% endfor %}{% endfor %}`, true},
		{"content_name_in_macro", `{% macro r(content) %}{% for c in content %}{{ c }}{% endfor %}{% endmacro %}{% for message in messages %}{{ r(message.content) }}{% endfor %}`, true},
		{"macro_other_param", `{% macro r(x) %}{% for c in x %}{{ c }}{% endfor %}{% endmacro %}{% for message in messages %}{{ r(message.content) }}{% endfor %}`, true},
		{"string_only", `{% for message in messages %}{{ message['content'] | trim }}{% endfor %}`, false},
		{"for_if", `{% for message in messages if message.role != 'system' %}{% for c in message.content %}{{ c }}{% endfor %}{% endfor %}`, true},
		{"reverse_filter", `{% for message in messages | reverse %}{% for c in message.content %}{{ c }}{% endfor %}{% endfor %}`, true},
		{"content_is_string_test", `{% for message in messages %}{% if message.content is string %}{{ message.content }}{% else %}{% for c in message.content %}{{ c.text }}{% endfor %}{% endif %}{% endfor %}`, true},
		{"whitespace_ctrl", `{%- for message in messages -%}{%- for item in message["content"] -%}{{ item }}{%- endfor -%}{%- endfor -%}`, true},
		{"other_loop_content", `{% for tool in tools %}{% for c in tool.content %}{{ c }}{% endfor %}{% endfor %}`, false},
	} {
		if got := loopsOverContent(c.src); got != c.parts {
			t.Errorf("%s: loopsOverContent = %v, vLLM detects parts content: %v", c.name, got, c.parts)
		}
	}
}

func TestLoopsOverContentOnFamilyTemplates(t *testing.T) {
	for family, parts := range map[string]bool{
		"deepseek_v3": false,
		"gemma3":      true,
		"llama3":      false,
		"llama3_1":    false,
		"llama3_2":    false,
		"qwen3":       false,
	} {
		path := filepath.Join(tokenizerDir(family), "tokenizer_config.json")
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatalf("%s: %v (run make fixtures)", family, err)
		}
		var cfg tokenizerConfig
		if err := json.Unmarshal(data, &cfg); err != nil {
			t.Fatal(err)
		}
		src, _, err := templateSources(cfg.ChatTemplate)
		if err != nil {
			t.Fatal(err)
		}
		if got := loopsOverContent(src); got != parts {
			t.Errorf("%s: loopsOverContent = %v, vLLM detects parts content: %v", family, got, parts)
		}
	}
}
