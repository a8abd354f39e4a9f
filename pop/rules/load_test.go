package rules

import (
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/edgelimit/edgelimit/pop/limit"
)

// describe summarizes limits, sorted, for comparison.
func describe(ls []*Limit) []string {
	var out []string
	for _, l := range ls {
		s := fmt.Sprintf("%s: %d/%s %s %s", l.Name, l.Spec.Limit, l.Unit, l.Spec.Algorithm, l.Scope)
		if l.Spec.Burst > 0 {
			s += fmt.Sprintf(" burst=%d", l.Spec.Burst)
		}
		for _, f := range []struct {
			on   bool
			name string
		}{{l.Shadow, "shadow"}, {l.Unlimited, "unlimited"}, {l.FailClosed, "fail_closed"}} {
			if f.on {
				s += " " + f.name
			}
		}
		out = append(out, s)
	}
	slices.Sort(out)
	return out
}

// entries parses "k=v" pairs; a pair without "=" has an empty value.
func entries(pairs ...string) []Entry {
	var es []Entry
	for _, p := range pairs {
		k, v, _ := strings.Cut(p, "=")
		es = append(es, Entry{Key: k, Value: v})
	}
	return es
}

// writeFile writes a rule file named name into dir and returns its path.
func writeFile(t testing.TB, dir, name, text string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

type matchCase struct {
	name    string
	entries []Entry
	want    []string
}

func checkMatches(t *testing.T, d *Domain, cases []matchCase) {
	t.Helper()
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := describe(d.Match(c.entries)); !reflect.DeepEqual(got, c.want) {
				t.Errorf("Match(%v) = %q, want %q", c.entries, got, c.want)
			}
		})
	}
}

func TestLoadSeed(t *testing.T) {
	set, warns, err := Load("testdata/seed.yaml")
	if err != nil || len(warns) > 0 {
		t.Fatalf("Load: err %v, warnings %v", err, warns)
	}
	d := set.Domain("api_platform")
	if d == nil || d.File != "testdata/seed.yaml" {
		t.Fatalf("domain api_platform = %+v", d)
	}
	checkMatches(t, d, []matchCase{
		{"api key", entries("api_key=abc123"), []string{"api_key: 100/minute sliding_window pop"}},
		{"nested endpoint", entries("api_key=abc123", "endpoint=POST /api/v1/orders"),
			[]string{"api_key.endpoint=POST /api/v1/orders: 20/minute sliding_window pop"}},
		{"other endpoint leaves tree", entries("api_key=abc123", "endpoint=GET /x"), nil},
		{"remote address", entries("remote_address=192.168.1.100"), []string{"remote_address: 30/minute sliding_window pop"}},
		{"global aggregate", entries("global=aggregate"), []string{"global=aggregate: 10000/second sliding_window pop"}},
		{"global other value", entries("global=other"), nil},
	})
}

func TestLoadExample(t *testing.T) {
	const file = "../../deploy/examples/rules.yaml"
	set, warns, err := Load(file)
	if err != nil || len(warns) > 0 {
		t.Fatalf("Load: err %v, warnings %v", err, warns)
	}
	d := set.Domain("api_platform")
	if d == nil {
		t.Fatal("no domain api_platform")
	}
	for _, l := range set.Limits() {
		if l.Domain != "api_platform" {
			t.Errorf("limit %s has domain %q", l.Name, l.Domain)
		}
	}
	checkMatches(t, d, []matchCase{
		{"key only", entries("api_key=abc123"), []string{"api_key: 100/minute sliding_window pop"}},
		{"nested exact", entries("api_key=abc123", "endpoint=POST /api/v1/orders"),
			[]string{"api_key.endpoint=POST /api/v1/orders: 20/minute sliding_window pop"}},
		{"nested token bucket", entries("api_key=abc123", "endpoint=GET /api/v1/search"),
			[]string{"api_key.endpoint=GET /api/v1/search: 60/minute token_bucket pop burst=30"}},
		{"nested unknown value leaves tree", entries("api_key=abc123", "endpoint=DELETE /x"), nil},
		{"key only beats nothing", entries("remote_address=192.168.1.100"), []string{"remote_address: 30/minute sliding_window pop"}},
		{"wildcard beats key only", entries("remote_address=10.1.2.3"), []string{"remote_address=10.*: 0/second sliding_window pop unlimited"}},
		{"exact beats wildcard", entries("remote_address=10.0.0.99"), []string{"remote_address=10.0.0.99: 5/minute sliding_window pop shadow"}},
		{"global scope", entries("global=aggregate"), []string{"global=aggregate: 10000/second sliding_window global"}},
		{"several limits", entries("tenant=acme"), []string{
			"tenant_daily: 1000000/day sliding_window global fail_closed",
			"tenant_second: 50/second gcra pop burst=100",
		}},
		{"descriptor longer than tree", entries("remote_address=1.2.3.4", "extra=x"), nil},
		{"unknown key", entries("user=bob"), nil},
		{"no entries", nil, nil},
	})
	want := &ForwardAuth{DenyStatus: 429, Descriptors: [][]AuthEntry{
		{{Key: "api_key", From: "header:X-API-Key"}},
		{{Key: "api_key", From: "header:X-API-Key"}, {Key: "endpoint", From: "method_path"}},
		{{Key: "remote_address", From: "client_ip"}},
		{{Key: "global", Value: "aggregate"}},
	}}
	if !reflect.DeepEqual(d.ForwardAuth, want) {
		t.Errorf("ForwardAuth = %+v, want %+v", d.ForwardAuth, want)
	}
}

// TestLoadEnvoyExamples loads examples of envoyproxy/ratelimit's README unchanged.
func TestLoadEnvoyExamples(t *testing.T) {
	for _, c := range []struct {
		file, domain string
		warnings     []string
		matches      []matchCase
	}{
		{"envoy_messaging.yaml", "messaging", nil, []matchCase{
			{"nested", entries("message_type=marketing", "to_number=2061111111"), []string{"message_type=marketing.to_number: 5/day sliding_window pop"}},
			{"top", entries("to_number=2061111111"), []string{"to_number: 100/day sliding_window pop"}},
			{"placeholder has no limit", entries("message_type=marketing"), nil},
		}},
		{"envoy_replaces.yaml", "example7",
			nil,
			[]matchCase{
				{"named", entries("key_1=value_1", "user=bkthomps"), []string{"specific_limit: 5/second sliding_window pop"}},
				{"replacing", entries("key_2=value_2", "user=bkthomps"), []string{"key_2=value_2.user=bkthomps: 10/second sliding_window pop"}},
			}},
		{"envoy_detailed_metric.yaml", "example8",
			[]string{"testdata/envoy_detailed_metric.yaml:5: detailed_metric is not implemented by edgelimit and is ignored"},
			[]matchCase{
				{"key only", entries("key1=other"), []string{"key1: 10/minute sliding_window pop"}},
				{"exact", entries("key1=value1"), []string{"key1=value1: 20/minute sliding_window pop"}},
			}},
		{"envoy_unlimited.yaml", "internal", nil, []matchCase{
			{"unlimited", entries("ldap=x"), []string{"ldap: 0/second sliding_window pop unlimited"}},
			{"limited", entries("azure=x"), []string{"azure: 100/minute sliding_window pop"}},
		}},
	} {
		t.Run(c.file, func(t *testing.T) {
			set, warns, err := Load(filepath.Join("testdata", c.file))
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, w := range warns {
				got = append(got, w.String())
			}
			if !reflect.DeepEqual(got, c.warnings) {
				t.Errorf("warnings = %q, want %q", got, c.warnings)
			}
			d := set.Domain(c.domain)
			if d == nil {
				t.Fatalf("no domain %q", c.domain)
			}
			checkMatches(t, d, c.matches)
		})
	}
}

// TestLoadAccepts covers inputs that must load, and what they load as.
func TestLoadAccepts(t *testing.T) {
	for _, c := range []struct {
		name     string
		yaml     string
		entries  []Entry
		want     []string
		warnings []string
	}{
		{"zero denies all", "domain: d\ndescriptors:\n  - key: ip\n    value: 50.0.0.5\n    rate_limit: {unit: second, requests_per_unit: 0}\n",
			entries("ip=50.0.0.5"), []string{"ip=50.0.0.5: 0/second sliding_window pop"}, nil},
		{"numeric value and uppercase unit", "domain: d\ndescriptors:\n  - key: port\n    value: 8080\n    rate_limit: {unit: MINUTE, requests_per_unit: 3}\n",
			entries("port=8080"), []string{"port=8080: 3/minute sliding_window pop"}, nil},
		{"yaml 1.1 booleans", "domain: d\ndescriptors:\n  - key: k\n    shadow_mode: yes\n    rate_limit: {unit: hour, requests_per_unit: 3, fail_closed: on}\n",
			entries("k=v"), []string{"k: 3/hour sliding_window pop shadow fail_closed"}, nil},
		{"anchors and merge keys", "domain: d\ndescriptors:\n  - key: a\n    rate_limit: &base {unit: minute, requests_per_unit: 7}\n  - key: b\n    rate_limit:\n      <<: *base\n      requests_per_unit: 9\n",
			entries("b=x"), []string{"b: 9/minute sliding_window pop"}, nil},
		{"empty rate_limit", "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n",
			entries("k=v"), nil, []string{"rules.yaml:4: rate_limit is empty and is ignored"}},
		{"value without limit shadows key only", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n  - key: k\n    value: vip\n",
			entries("k=vip"), nil, nil},
		{"envoy-only descriptor fields", "domain: d\ndescriptors:\n  - key: k\n    value: v*\n    share_threshold: true\n    value_to_metric: true\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
			entries("k=v1"), []string{"k=v*: 1/second sliding_window pop"}, []string{
				"rules.yaml:6: value_to_metric is not implemented by edgelimit and is ignored",
			}},
		{"all algorithms", "domain: d\ndescriptors:\n  - key: k\n    rate_limits:\n" +
			"      - {unit: second, requests_per_unit: 1, algorithm: fixed_window}\n" +
			"      - {unit: second, requests_per_unit: 2, algorithm: sliding_log}\n" +
			"      - {unit: minute, requests_per_unit: 3, algorithm: gcra}\n" +
			"      - {unit: minute, requests_per_unit: 4, algorithm: token_bucket}\n",
			entries("k=v"), []string{
				"k_minute: 3/minute gcra pop",
				"k_minute_2: 4/minute token_bucket pop",
				"k_second: 1/second fixed_window pop",
				"k_second_2: 2/second sliding_log pop",
			}, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			set, warns, err := Load(writeFile(t, t.TempDir(), "rules.yaml", c.yaml))
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, w := range warns {
				got = append(got, fmt.Sprintf("%s:%d: %s", filepath.Base(w.File), w.Line, w.Msg))
			}
			if !reflect.DeepEqual(got, c.warnings) {
				t.Errorf("warnings = %q, want %q", got, c.warnings)
			}
			if m := describe(set.Domain("d").Match(c.entries)); !reflect.DeepEqual(m, c.want) {
				t.Errorf("Match = %q, want %q", m, c.want)
			}
		})
	}
}

func TestLoadNames(t *testing.T) {
	const y = `domain: d
descriptors:
  - key: api_key
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: ip
    rate_limit: {unit: minute, requests_per_unit: 1, name: api_key}
  - key: t
    value: 'say "hi"'
    rate_limits:
      - {unit: minute, requests_per_unit: 1}
      - {unit: minute, requests_per_unit: 1, scope: global}
`
	set, _, err := Load(writeFile(t, t.TempDir(), "rules.yaml", y))
	if err != nil {
		t.Fatal(err)
	}
	d := set.Domain("d")
	for _, c := range []struct {
		entries   []Entry
		name      string
		path      string
		wantNames []string
	}{
		{entries("api_key=x"), "derived name yields to configured", "api_key", []string{"api_key_2"}},
		{entries("ip=x"), "configured name kept", "ip", []string{"api_key"}},
		{entries(`t=say "hi"`), "unit suffix, sanitized, numbered", `t=say "hi"`, []string{"t=say _hi__minute", "t=say _hi__minute_2"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			var names []string
			for _, l := range d.Match(c.entries) {
				names = append(names, l.Name)
				if l.Path != c.path || l.Domain != "d" {
					t.Errorf("limit %s: path %q domain %q, want %q and d", l.Name, l.Path, l.Domain, c.path)
				}
			}
			if !reflect.DeepEqual(names, c.wantNames) {
				t.Errorf("names = %q, want %q", names, c.wantNames)
			}
		})
	}
}

// TestLoadErrors checks that each mistake is reported with file, line and field.
func TestLoadErrors(t *testing.T) {
	const head = "domain: d\ndescriptors:\n"
	for _, c := range []struct {
		name string
		yaml string
		line int // 0: no line
		want []string
	}{
		{"typo in rate_limit", `domain: api_platform
descriptors:
  - key: api_key
    descriptors:
      - key: endpoint
        rate_limit:
          request_per_unit: 20
          unit: minute
`, 7, []string{`unknown field "request_per_unit" in rate_limit`}},
		{"unknown top-level field", "domain: d\ndescriptor: []\n", 2, []string{`unknown field "descriptor" in the rule file`}},
		{"unknown descriptor field", head + "  - key: k\n    valeu: x\n", 4, []string{`unknown field "valeu" in descriptor`}},
		{"mitigation must be a mapping", head + "  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, scope: global, mitigation: true}\n", 4, []string{"mitigation must be a mapping"}},
		{"mitigation on a pop limit", head + "  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, mitigation: {duration: 10m}}\n", 4, []string{"mitigation applies to scope region or global"}},
		{"consistency on a pop limit", head + "  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, consistency: bounded}\n", 4, []string{"consistency applies to scope region or global"}},
		{"unknown consistency", head + "  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, scope: global, consistency: exact}\n", 4, []string{`unknown consistency "exact"`, "eventual, bounded or strong"}},
		{"bounded with mitigation", head + "  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, scope: global, consistency: bounded, mitigation: {duration: 1m}}\n", 4, []string{"mitigation does not combine with consistency bounded"}},
		{"strong with mitigation", head + "  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, scope: global, consistency: strong, mitigation: {duration: 1m}}\n", 4, []string{"mitigation does not combine with consistency strong"}},
		{"mitigation with a bad duration", head + "  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, scope: global, mitigation: {duration: soon}}\n", 4, []string{"mitigation.duration"}},
		{"mitigation with an unknown field", head + "  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, scope: global, mitigation: {duration: 1m, for: 2m}}\n", 4, []string{`unknown field "for" in mitigation`}},
		{"missing key", head + "  - value: x\n    rate_limit: {unit: second, requests_per_unit: 1}\n", 3, []string{"descriptor has no key"}},
		{"empty key", head + "  - key: \"\"\n", 3, []string{"key must not be empty"}},
		{"missing domain", "descriptors: []\n", 1, []string{"domain is required"}},
		{"empty domain", "domain: ''\n", 1, []string{"domain must not be empty"}},
		{"domain not a string", "domain: [a]\n", 1, []string{"domain must be a string"}},
		{"unknown unit", head + "  - key: k\n    rate_limit:\n      unit: fortnight\n      requests_per_unit: 1\n", 5, []string{`unit: unknown unit "fortnight"`}},
		{"unknown algorithm", head + "  - key: k\n    rate_limit:\n      unit: second\n      requests_per_unit: 1\n      algorithm: leaky\n", 7, []string{`algorithm: unknown algorithm "leaky"`}},
		{"scope on an algorithm that cannot replicate", head + "  - key: k\n    rate_limit:\n      unit: second\n      requests_per_unit: 1\n      algorithm: token_bucket\n      scope: global\n", 8, []string{"scope global counts across PoPs", "token_bucket is per-PoP only"}},
		{"unknown scope", head + "  - key: k\n    rate_limit:\n      unit: second\n      requests_per_unit: 1\n      scope: planet\n", 7, []string{`scope: unknown scope "planet"`}},
		{"negative requests_per_unit", head + "  - key: k\n    rate_limit:\n      unit: second\n      requests_per_unit: -5\n", 6, []string{"requests_per_unit must be >= 0, got -5"}},
		{"missing requests_per_unit", head + "  - key: k\n    rate_limit:\n      unit: second\n", 4, []string{"rate_limit has no requests_per_unit"}},
		{"missing unit", head + "  - key: k\n    rate_limit:\n      requests_per_unit: 4\n", 4, []string{"rate_limit has no unit"}},
		{"unlimited with quota", head + "  - key: k\n    rate_limit:\n      unlimited: true\n      requests_per_unit: 4\n", 6, []string{"requests_per_unit is 4 but the limit is unlimited"}},
		{"duplicate siblings", head + "  - key: k\n    value: v\n  - key: k\n    value: v\n", 5, []string{`duplicate descriptor key "k" value "v" (first at line 3)`}},
		{"duplicate nested siblings", head + "  - key: a\n    descriptors:\n      - key: k\n      - key: k\n", 6, []string{`duplicate descriptor key "k" value ""`}},
		{"duplicate field", head + "  - key: k\n    key: j\n", 4, []string{`duplicate field "key" in descriptor (first at line 3)`}},
		{"bad yaml", head + "  - key: k\n    rate_limit: {unit: second\n  - key: j\n", 4, []string{"invalid YAML", "did not find expected ',' or '}'"}},
		{"bad yaml indentation", head + "  - key: k\n   value: v\n", 4, []string{"invalid YAML", "expected '-' indicator"}},
		// yaml names the line where the enclosing mapping starts (3); the
		// mistake, a key indented one space short, is 13 lines further.
		{"bad yaml indentation deep in a mapping", head + "  - key: k\n    descriptors:\n" + strings.Repeat("      - key: e\n", 9) +
			"      - key: f\n        value: v\n       shadow_mode: true\n", 16, []string{"invalid YAML", "did not find expected '-' indicator"}},
		{"requests_per_unit not a number", head + "  - key: k\n    rate_limit:\n      unit: second\n      requests_per_unit: lots\n", 6, []string{`requests_per_unit must be an integer, got "lots"`}},
		{"requests_per_unit quoted", head + "  - key: k\n    rate_limit: {unit: second, requests_per_unit: \"5\"}\n", 4, []string{`requests_per_unit must be an integer, got "5"`}},
		{"shadow_mode not a bool", head + "  - key: k\n    shadow_mode: maybe\n", 4, []string{`shadow_mode must be true or false, got "maybe"`}},
		{"descriptors not a list", head + "  - key: k\n    descriptors: x\n", 4, []string{`descriptors must be a list, got "x"`}},
		{"rate_limit not a mapping", head + "  - key: k\n    rate_limit: 5\n", 4, []string{`rate_limit must be a mapping, got "5"`}},
		{"descriptor not a mapping", head + "  - k\n", 3, []string{`descriptor must be a mapping, got "k"`}},
		{"burst on sliding_window", head + "  - key: k\n    rate_limit:\n      unit: second\n      requests_per_unit: 1\n      burst: 5\n", 7, []string{"burst applies to token_bucket and gcra only"}},
		{"negative burst", head + "  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, algorithm: gcra, burst: -1}\n", 4, []string{"burst must be >= 0, got -1"}},
		{"sliding_log too large", head + "  - key: k\n    rate_limit:\n      unit: second\n      requests_per_unit: 5000\n      algorithm: sliding_log\n", 4, []string{"rate_limit: sliding_log", "at most 1000"}},
		{"rate_limit and rate_limits", head + "  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n    rate_limits: []\n", 5, []string{"rate_limit or rate_limits, not both"}},
		{"empty rate_limits", head + "  - key: k\n    rate_limits: []\n", 4, []string{"rate_limits must list at least one limit"}},
		{"shared counter", head + "  - key: k\n    rate_limits:\n      - {unit: second, requests_per_unit: 1}\n      - {unit: minute, requests_per_unit: 1}\n      - {unit: second, requests_per_unit: 5, algorithm: sliding_window, scope: pop}\n",
			7, []string{"algorithm sliding_window, window 1s and scope pop would share one counter (first at line 5)"}},
		{"unlimited with unit", head + "  - key: k\n    rate_limit: {unlimited: true, unit: day, requests_per_unit: 0}\n", 4, []string{`an unlimited limit takes no unit, got "day"`}},
		{"replaces itself", head + "  - key: k\n    rate_limit:\n      name: me\n      unit: day\n      requests_per_unit: 1\n      replaces: [{name: me}]\n", 8, []string{`replaces names the limit itself ("me")`}},
		{"replaces nothing", head + "  - key: k\n    rate_limit:\n      unit: day\n      requests_per_unit: 1\n      replaces: [{name: }]\n", 7, []string{"replaces entry has no name"}},
		{"share_threshold without wildcard", head + "  - key: k\n    value: v\n    share_threshold: true\n    rate_limit: {unit: day, requests_per_unit: 1}\n", 5, []string{`share_threshold applies to a wildcard value (one holding '*'), got value "v"`}},
		{"unit_multiplier 0", head + "  - key: k\n    rate_limit: {unit: day, requests_per_unit: 1, unit_multiplier: 0}\n", 4, []string{"unit_multiplier must be between 1 and 3650 for unit day"}},
		{"window over ten years", head + "  - key: k\n    rate_limit: {unit: year, requests_per_unit: 1, unit_multiplier: 11}\n", 4, []string{"unit_multiplier must be between 1 and 10 for unit year"}},
		{"unlimited among limits", head + "  - key: k\n    rate_limits:\n      - {unit: second, requests_per_unit: 1}\n      - {unlimited: true}\n", 6, []string{"unlimited limit cannot share a descriptor"}},
		{"typo in rate_limits entry", head + "  - key: k\n    rate_limits:\n      - unit: second\n        requests_per_units: 1\n", 6, []string{`unknown field "requests_per_units" in rate_limit`}},
		{"bad name", head + "  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, name: 'a\"b'}\n", 4, []string{`name "a\"b"`, "not allowed"}},
		{"fail_closed not a bool", head + "  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, fail_closed: 2}\n", 4, []string{"fail_closed must be true or false"}},
		{"second document", "domain: d\n---\ndomain: e\n", 2, []string{"second YAML document"}},
		{"not a mapping", "- a\n", 1, []string{"the rule file must be a mapping, got a list"}},
		{"empty file", "# nothing\n", 0, []string{"file is empty"}},
		{"unknown anchor", head + "  - *nope\n", 0, []string{"invalid YAML", "unknown anchor"}},
		{"alias cycle", "domain: d\ndescriptors: &l\n  - key: k\n    descriptors: *l\n", 3, []string{"descriptors nest deeper than"}},
		{"deny_status not 4xx", "domain: d\nforward_auth:\n  deny_status: 500\n  descriptors: [{entries: [{key: ip, from: client_ip}]}]\n", 3, []string{"deny_status must be a 4xx status", "got 500"}},
		{"unknown from", "domain: d\nforward_auth:\n  descriptors:\n    - entries:\n        - {key: ip, from: client_addr}\n", 5, []string{`from "client_addr"`}},
		{"bad header name", "domain: d\nforward_auth:\n  descriptors:\n    - entries:\n        - {key: ip, from: 'header:X Key'}\n", 5, []string{`from "header:X Key"`}},
		{"from and value", "domain: d\nforward_auth:\n  descriptors:\n    - entries:\n        - {key: ip, from: client_ip, value: x}\n", 5, []string{"exactly one of from and value"}},
		{"forward_auth typo", "domain: d\nforward_auth:\n  deny_code: 403\n  descriptors: [{entries: [{key: ip, from: client_ip}]}]\n", 3, []string{`unknown field "deny_code" in forward_auth`}},
		{"forward_auth without descriptors", "domain: d\nforward_auth: {deny_status: 403}\n", 2, []string{"forward_auth has no descriptors"}},
		{"forward_auth entry without key", "domain: d\nforward_auth:\n  descriptors:\n    - entries:\n        - {from: client_ip}\n", 5, []string{"forward_auth entry has no key"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			file := writeFile(t, t.TempDir(), "rules.yaml", c.yaml)
			set, _, err := Load(file)
			if err == nil {
				t.Fatalf("Load succeeded with %d limits, want an error", len(set.Limits()))
			}
			where := file + ": "
			if c.line > 0 {
				where = fmt.Sprintf("%s:%d: ", file, c.line)
			}
			msg := err.Error()
			if !strings.Contains(msg, where) {
				t.Errorf("error %q does not name %q", msg, where)
			}
			for _, w := range c.want {
				if !strings.Contains(msg, w) {
					t.Errorf("error %q does not contain %q", msg, w)
				}
			}
		})
	}
}

func TestLoadDirectory(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, dir, "a.yaml", "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n")
	// A ConfigMap mount: b.yml links into ..data, which links to a timestamped dir.
	if err := os.Mkdir(filepath.Join(dir, "..2026_01_01"), 0o755); err != nil {
		t.Fatal(err)
	}
	writeFile(t, dir, "..2026_01_01/b.yml", "domain: b\n")
	for old, link := range map[string]string{"..2026_01_01": "..data", "..data/b.yml": "b.yml"} {
		if err := os.Symlink(old, filepath.Join(dir, link)); err != nil {
			t.Fatal(err)
		}
	}
	writeFile(t, dir, ".hidden.yaml", "not: [valid")
	writeFile(t, dir, "notes.txt", "not: [valid")
	if err := os.Mkdir(filepath.Join(dir, "sub.yaml"), 0o755); err != nil {
		t.Fatal(err)
	}
	writeFile(t, dir, "sub.yaml/c.yaml", "domain: c\n")

	set, warns, err := Load(dir)
	if err != nil || len(warns) > 0 {
		t.Fatalf("Load: err %v, warnings %v", err, warns)
	}
	var names []string
	for _, d := range set.Domains() {
		names = append(names, d.Name+"@"+filepath.Base(d.File))
	}
	slices.Sort(names)
	if want := []string{"a@a.yaml", "b@b.yml"}; !reflect.DeepEqual(names, want) {
		t.Errorf("domains = %q, want %q", names, want)
	}

	t.Run("empty directory warns", func(t *testing.T) {
		empty := t.TempDir()
		set, warns, err := Load(empty)
		if err != nil || len(set.Domains()) != 0 || len(warns) != 1 || !strings.Contains(warns[0].String(), "no *.yaml") {
			t.Errorf("Load(empty dir) = %v domains, warnings %v, err %v", set, warns, err)
		}
	})
	t.Run("missing path", func(t *testing.T) {
		missing := filepath.Join(dir, "missing.yaml")
		if _, _, err := Load(missing); err == nil || !strings.Contains(err.Error(), missing) {
			t.Errorf("Load(missing) error = %v, want one naming %s", err, missing)
		}
	})
}

func TestLoadDuplicateDomain(t *testing.T) {
	dir := t.TempDir()
	first := writeFile(t, dir, "first.yaml", "domain: same\n")
	second := writeFile(t, dir, "second.yaml", "domain: same\n")
	_, _, err := Load(dir)
	if err == nil || !strings.Contains(err.Error(), first) || !strings.Contains(err.Error(), second) || !strings.Contains(err.Error(), `"same"`) {
		t.Errorf("error = %v, want one naming %s, %s and the domain", err, first, second)
	}
}

func TestLoadReportsEveryFile(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, dir, "a.yaml", "domain: a\nfoo: 1\n")
	writeFile(t, dir, "b.yaml", "domain: b\nbar: 1\n")
	_, _, err := Load(dir)
	if err == nil || !strings.Contains(err.Error(), `a.yaml:2: unknown field "foo"`) || !strings.Contains(err.Error(), `b.yaml:2: unknown field "bar"`) {
		t.Errorf("error = %v, want both files' errors", err)
	}
}

func FuzzLoad(f *testing.F) {
	for _, p := range []string{"testdata/*.yaml", "../../deploy/examples/*.yaml"} {
		files, _ := filepath.Glob(p)
		for _, name := range files {
			data, err := os.ReadFile(name)
			if err != nil {
				f.Fatal(err)
			}
			f.Add(data)
		}
	}
	f.Add([]byte("domain: d\ndescriptors: &l\n  - key: k\n    descriptors: *l\n"))
	f.Add([]byte("domain: d\ndescriptors:\n  - &x {key: k, descriptors: [{<<: *x, value: a}, {<<: *x, value: b}]}\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		// build is Load after reading the files.
		set, _, err := build([]ruleFile{{"fuzz.yaml", data}}, Options{})
		if err != nil {
			return
		}
		names := map[string]bool{}
		for _, l := range set.Limits() {
			if err := l.Spec.Validate(); err != nil {
				t.Fatalf("limit %s: %v", l.Name, err)
			}
			if l.Spec.Algorithm > limit.SlidingLog || l.Unit > Day || l.Scope > ScopeGlobal {
				t.Fatalf("limit %s out of range: %+v", l.Name, l)
			}
			if names[l.Domain+"\x00"+l.Name] {
				t.Fatalf("name %q repeats in domain %q", l.Name, l.Domain)
			}
			names[l.Domain+"\x00"+l.Name] = true
		}
	})
}

func TestLoadMitigation(t *testing.T) {
	set, _, err := Load(writeFile(t, t.TempDir(), "rules.yaml",
		"domain: d\ndescriptors:\n  - key: ip\n    rate_limit: {unit: minute, requests_per_unit: 100, scope: global, mitigation: {duration: 10m}}\n"))
	if err != nil {
		t.Fatal(err)
	}
	ls := set.Domain("d").Match([]Entry{{Key: "ip", Value: "1.2.3.4"}})
	if len(ls) != 1 || ls[0].Mitigation != 10*time.Minute {
		t.Fatalf("limits %+v, want one with a 10m mitigation", ls)
	}
}

func TestLoadConsistency(t *testing.T) {
	set, _, err := Load(writeFile(t, t.TempDir(), "rules.yaml", "domain: d\ndescriptors:\n"+
		"  - key: ip\n    rate_limits:\n"+
		"      - {unit: minute, requests_per_unit: 100, scope: global, consistency: bounded}\n"+
		"      - {unit: hour, requests_per_unit: 1000, scope: region}\n"+
		"      - {unit: day, requests_per_unit: 5000, scope: global, consistency: strong, fail_closed: true}\n"))
	if err != nil {
		t.Fatal(err)
	}
	ls := set.Domain("d").Match([]Entry{{Key: "ip", Value: "1.2.3.4"}})
	if len(ls) != 3 || ls[0].Consistency != limit.Bounded || ls[1].Consistency != limit.Eventual || ls[2].Consistency != limit.Strong || !ls[2].FailClosed {
		t.Fatalf("limits %+v, want a bounded, an eventual (the default) and a fail_closed strong one", ls)
	}
}
