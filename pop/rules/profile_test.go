package rules

import (
	"reflect"
	"strings"
	"testing"

	"github.com/edgelimit/edgelimit/pop/limit"
)

// The options of Envoy's ratelimit's profile: a limit without an algorithm
// counts with Options.DefaultAlgorithm (one that names its own keeps it),
// and Options.QuotaMode puts every limit in quota mode.
func TestLoadOptionsOfTheEnvoyProfile(t *testing.T) {
	file := writeFile(t, t.TempDir(), "r.yaml", `domain: d
descriptors:
  - key: plain
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: named
    rate_limit: {unit: minute, requests_per_unit: 5, algorithm: sliding_window}
`)
	for _, tc := range []struct {
		name         string
		opts         Options
		plain, name2 limit.Algorithm
		quota        bool
	}{
		{"defaults", Options{}, limit.SlidingWindow, limit.SlidingWindow, false},
		{"fixed windows by default", Options{DefaultAlgorithm: limit.FixedWindow}, limit.FixedWindow, limit.SlidingWindow, false},
		{"quota mode", Options{QuotaMode: true}, limit.SlidingWindow, limit.SlidingWindow, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			set, _, err := LoadWith(tc.opts, file)
			if err != nil {
				t.Fatal(err)
			}
			d := set.Domain("d")
			p, n := d.Match(entries("plain=x"))[0], d.Match(entries("named=x"))[0]
			if p.Spec.Algorithm != tc.plain || n.Spec.Algorithm != tc.name2 {
				t.Errorf("algorithms %s and %s, want %s and %s", p.Spec.Algorithm, n.Spec.Algorithm, tc.plain, tc.name2)
			}
			if p.QuotaMode != tc.quota || n.QuotaMode != tc.quota {
				t.Errorf("quota mode %v and %v, want %v", p.QuotaMode, n.QuotaMode, tc.quota)
			}
		})
	}
}

// A descriptor's metadata (Envoy's ratelimit's test/config/metadata.yaml)
// loads onto its limits as JSON-like values; what JSON cannot hold is an
// error naming the line.
func TestLoadMetadata(t *testing.T) {
	dir := t.TempDir()
	set, warns, err := Load(writeFile(t, dir, "m.yaml", `domain: test-domain
descriptors:
  - key: key1
    value: value1
    descriptors:
      - key: subkey1
        rate_limit: {unit: second, requests_per_unit: 5}
        metadata:
          name: service_1
  - key: key2
    rate_limit: {unit: minute, requests_per_unit: 20}
    metadata:
      service_with_quota:
        name: service_2
        tiers: [1, gold, true, null]
`))
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range warns {
		if strings.Contains(w.Msg, "metadata") {
			t.Errorf("warning %v: metadata is no longer ignored", w)
		}
	}
	d := set.Domain("test-domain")
	if got, want := d.Match(entries("key1=value1", "subkey1=x"))[0].Metadata, map[string]any{"name": "service_1"}; !reflect.DeepEqual(got, want) {
		t.Errorf("key1.subkey1 metadata %v, want %v", got, want)
	}
	want := map[string]any{"service_with_quota": map[string]any{"name": "service_2", "tiers": []any{1.0, "gold", true, nil}}}
	if got := d.Match(entries("key2=x"))[0].Metadata; !reflect.DeepEqual(got, want) {
		t.Errorf("key2 metadata %v, want %v", got, want)
	}

	_, _, err = Load(writeFile(t, dir, "bad.yaml", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n    metadata: [a, b]\n"))
	if err == nil || !strings.Contains(err.Error(), "bad.yaml:5") || !strings.Contains(err.Error(), "metadata must be a mapping") {
		t.Errorf("error %v, want one naming bad.yaml:5 and the mapping", err)
	}
}
