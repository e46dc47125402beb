package bench

import (
	"testing"

	"gopkg.in/yaml.v3"

	"github.com/kvroute/kvroute/pkg/policy"
)

// configFields flattens a policy config to "section.field" -> value, as
// its YAML form names them.
func configFields(t *testing.T, cfg policy.Config) map[string]any {
	t.Helper()
	b, err := yaml.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]map[string]any
	if err := yaml.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	out := map[string]any{}
	for sec, fields := range m {
		for k, v := range fields {
			if n, ok := v.(int); ok { // YAML reads a whole number as an int
				v = float64(n)
			}
			out[sec+"."+k] = v
		}
	}
	return out
}

// Every knob -knobs and tune accept writes the config field of its own
// name, in its own policy's section, and nothing else: a knob whose
// setter wrote another field would silently tune the wrong thing.
func TestKnobsSetTheFieldTheyName(t *testing.T) {
	zero := configFields(t, policy.Config{})
	names := []string{policy.NameBlended, policy.NameHardSwitch, policy.NamePrefixAffinity,
		policy.NameSession, policy.NameWeighted, policy.NameKVRoute}
	for _, name := range names {
		knobs := Knobs(name)
		if len(knobs) == 0 {
			t.Errorf("%s has no knobs", name)
		}
		seen := map[string]bool{}
		for _, k := range knobs {
			if seen[k.Name] {
				t.Errorf("%s.%s listed twice", name, k.Name)
			}
			seen[k.Name] = true
			if len(k.Values) < 2 {
				t.Errorf("%s.%s: a grid of %d values", name, k.Name, len(k.Values))
				continue
			}
			v := k.Values[len(k.Values)-1]
			var cfg policy.Config
			k.Set(&cfg, v)
			got := configFields(t, cfg)
			key := name + "." + k.Name
			if f, ok := got[key].(float64); !ok || f != v {
				t.Errorf("%s set to %v: the config's %s is %v", key, v, key, got[key])
			}
			for field, val := range got {
				if field != key && val != zero[field] {
					t.Errorf("%s set to %v also changed %s (%v)", key, v, field, val)
				}
			}
		}
	}
	for _, want := range []string{"prefix_share_bound", "memory_reserve"} {
		found := false
		for _, k := range Knobs(policy.NameKVRoute) {
			found = found || k.Name == want
		}
		if !found {
			t.Errorf("kvroute has no knob %s", want)
		}
	}
}
