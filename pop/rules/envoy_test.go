package rules

import (
	"strings"
	"testing"
	"time"

	"github.com/edgelimit/edgelimit/pop/limit"
)

// TestWildcards: a '*' in the middle of a value, or several, matches as
// Envoy's ratelimit matches it (test/config/wildcard.yaml's cases); an exact
// value wins over a wildcard, the longest trailing prefix over another
// wildcard, and a pattern over the key-only descriptor.
func TestWildcards(t *testing.T) {
	dir := t.TempDir()
	set, _, err := Load(writeFile(t, dir, "w.yaml", `domain: d
descriptors:
  - key: midWild
    value: bar*b
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: multiWild
    value: foo*bar*baz
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: multiWild
    value: foo*
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: multiWild
    value: foo*bar*bazz
    rate_limit: {unit: minute, requests_per_unit: 4}
  - key: multiWild
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: multiWild
    value: fooXbarXbaz
    rate_limit: {unit: minute, requests_per_unit: 6}
`))
	if err != nil {
		t.Fatal(err)
	}
	d := set.Domain("d")
	checkMatches(t, d, []matchCase{
		{"middle", entries("midWild=barXXb"), []string{"midWild=bar*b: 1/minute sliding_window pop"}},
		{"middle matches empty", entries("midWild=barb"), []string{"midWild=bar*b: 1/minute sliding_window pop"}},
		{"middle needs the suffix", entries("midWild=barbx"), nil},
		{"prefix and suffix may not overlap", entries("midWild=bab"), nil},
		{"exact beats wildcards", entries("multiWild=fooXbarXbaz"), []string{"multiWild=fooXbarXbaz: 6/minute sliding_window pop"}},
		{"trailing prefix beats other patterns", entries("multiWild=fooYbarYbaz"), []string{"multiWild=foo*: 3/minute sliding_window pop"}},
		{"key only when no pattern fits", entries("multiWild=nope"), []string{"multiWild: 5/minute sliding_window pop"}},
	})
	kn := d.root.children["multiWild"]
	var patterns []string
	for _, g := range kn.globs {
		patterns = append(patterns, g.pattern)
	}
	if strings.Join(patterns, " ") != "foo*bar*baz foo*bar*bazz" {
		t.Fatalf("patterns in file order: %q", patterns)
	}
	for _, c := range []struct {
		v    string
		want bool
	}{{"foobarbaz", true}, {"fooAbarBbaz", true}, {"foobazbar", false}, {"foobarba", false}, {"fobarbaz", false}, {"foo-bar-baz-baz", true}} {
		if got := globMatch(strings.Split("foo*bar*baz", "*"), c.v); got != c.want {
			t.Errorf("globMatch(foo*bar*baz, %q) = %v, want %v", c.v, got, c.want)
		}
	}
}

// TestShareThreshold: values matching a share_threshold wildcard share one
// counter, at its own level and below it; without it each value counts alone.
func TestShareThreshold(t *testing.T) {
	set, _, err := Load(writeFile(t, t.TempDir(), "s.yaml", `domain: d
descriptors:
  - key: files
    value: files/*
    share_threshold: true
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: apart
    value: files/*
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: top
    value: top/*
    share_threshold: true
    descriptors:
      - key: files
        value: nested/*
        rate_limit: {unit: minute, requests_per_unit: 300}
`))
	if err != nil {
		t.Fatal(err)
	}
	d := set.Domain("d")
	key := func(pairs ...string) string {
		e := entries(pairs...)
		ls := d.Match(e)
		if len(ls) != 1 {
			t.Fatalf("Match(%v) = %v", e, ls)
		}
		return string(ls[0].AppendKey(nil, e))
	}
	if key("files=files/a") != key("files=files/b") {
		t.Error("share_threshold: files/a and files/b count apart")
	}
	if key("apart=files/a") == key("apart=files/b") {
		t.Error("no share_threshold: files/a and files/b share a counter")
	}
	if a, b := key("top=top/a", "files=nested/a"), key("top=top/b", "files=nested/a"); a != b {
		t.Error("share_threshold above: top/a and top/b count apart")
	}
	if a, b := key("top=top/a", "files=nested/a"), key("top=top/a", "files=nested/b"); a == b {
		t.Error("no share_threshold on the leaf: nested/a and nested/b share a counter")
	}
}

// TestMergeDomains: with Options.MergeDomains two files of one domain join;
// a descriptor both define is still an error, and without the option the
// second file is.
func TestMergeDomains(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, dir, "a.yaml", "domain: d\ndescriptors:\n  - key: key1\n    value: value1\n    rate_limit: {unit: minute, requests_per_unit: 10}\n")
	writeFile(t, dir, "b.yaml", "domain: d\ndescriptors:\n  - key: key2\n    value: value2\n    rate_limit: {unit: minute, requests_per_unit: 20}\n  - key: key1\n    value: other\n    rate_limit: {unit: minute, requests_per_unit: 30}\n")
	if _, _, err := Load(dir); err == nil || !strings.Contains(err.Error(), "--merge-domains") {
		t.Fatalf("without merging: err = %v, want a duplicate domain naming --merge-domains", err)
	}
	set, _, err := LoadWith(Options{MergeDomains: true}, dir)
	if err != nil {
		t.Fatal(err)
	}
	checkMatches(t, set.Domain("d"), []matchCase{
		{"first file", entries("key1=value1"), []string{"key1=value1: 10/minute sliding_window pop"}},
		{"second file", entries("key2=value2"), []string{"key2=value2: 20/minute sliding_window pop"}},
		{"second file, key of the first", entries("key1=other"), []string{"key1=other: 30/minute sliding_window pop"}},
	})
	writeFile(t, dir, "c.yaml", "domain: d\ndescriptors:\n  - key: key1\n    value: value1\n    rate_limit: {unit: hour, requests_per_unit: 1}\n")
	if _, _, err := LoadWith(Options{MergeDomains: true}, dir); err == nil || !strings.Contains(err.Error(), "key1=value1 is already defined") {
		t.Fatalf("a descriptor in two files: err = %v", err)
	}
}

// TestReplacesResolved: replaces names resolve to the limits with those
// configured names, across merged files; an unknown name replaces nothing.
func TestReplacesResolved(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, dir, "a.yaml", "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {name: specific, unit: minute, requests_per_unit: 1}\n")
	writeFile(t, dir, "b.yaml", "domain: d\ndescriptors:\n  - key: b\n    rate_limit: {unit: minute, requests_per_unit: 2, replaces: [{name: specific}, {name: nobody}]}\n")
	set, _, err := LoadWith(Options{MergeDomains: true}, dir)
	if err != nil {
		t.Fatal(err)
	}
	d := set.Domain("d")
	b, a := d.Match(entries("b=x"))[0], d.Match(entries("a=x"))[0]
	if !d.HasReplaces() || len(b.Replaces) != 1 || b.Replaces[0] != a {
		t.Fatalf("b.Replaces = %v, want [a]", b.Replaces)
	}
}

// TestLongUnits: week, month and year are 7, 30 and 365 days, as in Envoy's
// ratelimit; unit_multiplier multiplies a window and is kept in the store key,
// where KeyWindow reads it back; keys of plain units keep their old form.
func TestLongUnits(t *testing.T) {
	set, _, err := Load(writeFile(t, t.TempDir(), "u.yaml", `domain: d
descriptors:
  - key: w
    rate_limit: {unit: week, requests_per_unit: 1}
  - key: mo
    rate_limit: {unit: month, requests_per_unit: 1}
  - key: y
    rate_limit: {unit: YEAR, requests_per_unit: 1}
  - key: five
    rate_limits:
      - {unit: minute, requests_per_unit: 1, unit_multiplier: 5}
      - {unit: minute, requests_per_unit: 1}
`))
	if err != nil {
		t.Fatal(err)
	}
	d := set.Domain("d")
	day := 24 * time.Hour
	for _, c := range []struct {
		key  string
		want time.Duration
	}{{"w", 7 * day}, {"mo", 30 * day}, {"y", 365 * day}} {
		l := d.Match(entries(c.key + "=x"))[0]
		k := string(l.AppendKey(nil, entries(c.key+"=x")))
		if got, ok := KeyWindow(k); !ok || got != c.want || l.Spec.Window != int64(c.want) {
			t.Errorf("%s: KeyWindow = %v %v, Spec.Window = %v, want %v", c.key, got, ok, time.Duration(l.Spec.Window), c.want)
		}
	}
	ls := d.Match(entries("five=x"))
	if len(ls) != 2 {
		t.Fatalf("five: %d limits", len(ls))
	}
	k5, k1 := string(ls[0].AppendKey(nil, entries("five=x"))), string(ls[1].AppendKey(nil, entries("five=x")))
	if w, ok := KeyWindow(k5); !ok || w != 5*time.Minute || ls[0].Window() != 5*time.Minute {
		t.Errorf("5-minute limit: KeyWindow = %v %v", w, ok)
	}
	if w, ok := KeyWindow(k1); !ok || w != time.Minute {
		t.Errorf("1-minute limit: KeyWindow = %v %v", w, ok)
	}
	if sc, ok := KeyScope(k5); !ok || sc != limit.ScopePOP {
		t.Errorf("KeyScope = %v %v", sc, ok)
	}
	if got, want := DescribeKey(k5), "d five=x (5×minute sliding_window pop)"; got != want {
		t.Errorf("DescribeKey = %q, want %q", got, want)
	}
	plain := &Limit{Domain: "d", Unit: Minute}
	if got := plain.AppendKey(nil, entries("five=x")); string(got) != string(append([]byte("\x01d\x04five\x01x"), 0, 0, byte(Minute), 0)) {
		t.Errorf("a plain key changed form: %q", got)
	}
}
