package main

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// Bad values of the profile's settings are refused, naming their source:
// the peer's variable under --envoy-compat, the flag otherwise.
func TestEnvoyCompatBadSettings(t *testing.T) {
	// Rules that do not exist: a setting that is not refused fails there,
	// never starting a PoP.
	rules := filepath.Join(t.TempDir(), "missing.yaml")
	for _, c := range []struct {
		args []string
		env  [2]string
		want string
	}{
		{[]string{"--envoy-compat"}, [2]string{"SHADOW_MODE", "maybe"}, `environment SHADOW_MODE="maybe"`},
		{[]string{"--envoy-compat"}, [2]string{"LIMIT_RESPONSE_HEADERS_ENABLED", "yes please"}, `environment LIMIT_RESPONSE_HEADERS_ENABLED="yes please"`},
		{[]string{"--envoy-compat"}, [2]string{"LIMIT_RESET_HEADER", "Reset Me"}, "--envoy-header-reset must be a header name"},
		{[]string{"--headers", "x-rate"}, [2]string{}, `--headers: unknown header group "x-rate"`},
		{[]string{"--default-algorithm", "leaky"}, [2]string{}, "--default-algorithm"},
	} {
		if c.env[0] != "" {
			t.Setenv(c.env[0], c.env[1])
		}
		var out, errb bytes.Buffer
		args := append(append([]string{"pop"}, c.args...), "--listen", "127.0.0.1:0", "--rules", rules, "--data", t.TempDir())
		if code := run(args, &out, &errb); code != 1 || !strings.Contains(errb.String(), c.want) {
			t.Errorf("%v %v: exit %d, stderr %q; want %q", c.args, c.env, code, errb.String(), c.want)
		}
		if c.env[0] != "" {
			os.Unsetenv(c.env[0])
		}
	}
}

// A PoP with --envoy-compat and the peer's environment answers as the peer:
// fixed windows (a denial resets with the minute), no edgelimit fields, the
// peer's fields under LIMIT_*_HEADER's names, denied hits counted; and a
// rule set without limits starts.
func TestEnvoyCompatPoP(t *testing.T) {
	bin := buildBinary(t)
	dir := t.TempDir()
	rules := filepath.Join(dir, "rules.yaml")
	os.WriteFile(rules, []byte("domain: edge\ndescriptors:\n  - key: api_key\n    rate_limit: {unit: minute, requests_per_unit: 1}\n"), 0o644)
	t.Setenv("LIMIT_RESPONSE_HEADERS_ENABLED", "true")
	t.Setenv("LIMIT_REMAINING_HEADER", "X-Left")
	addr := freeAddr(t)
	startPoP(t, bin, "--listen", addr, "--rules", rules, "--data", filepath.Join(dir, "data"), "--envoy-compat")

	post := func() (*http.Response, map[string]any) {
		t.Helper()
		resp, err := http.Post("http://"+addr+"/v1/check", "application/json",
			strings.NewReader(`{"domain":"edge","descriptors":[{"entries":[{"key":"api_key","value":"k"}]}]}`))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		var body map[string]any
		if err := json.Unmarshal(b, &body); err != nil {
			t.Fatalf("%v: %s", err, b)
		}
		return resp, body
	}
	resp, _ := post()
	if resp.StatusCode != 200 || resp.Header.Get("X-Left") != "0" || resp.Header.Get("Ratelimit-Limit") != "1" || resp.Header.Get("X-Ratelimit-Limit") != "" {
		t.Fatalf("1st: %d, headers %v; want 200 with Envoy's fields alone, remaining as X-Left", resp.StatusCode, resp.Header)
	}
	resp, body := post()
	now := time.Now()
	if resp.StatusCode != 429 {
		t.Fatalf("2nd: %d, want 429", resp.StatusCode)
	}
	st := body["statuses"].([]any)[0].(map[string]any)
	until, _ := st["duration_until_reset"].(string)
	d, err := time.ParseDuration(until)
	if err != nil {
		t.Fatalf("duration_until_reset %v: %v", st["duration_until_reset"], err)
	}
	// A fixed window resets at the next minute; a sliding one would make
	// the client wait into the minute after it.
	if left := time.Duration(60-now.Second()) * time.Second; d > left+2*time.Second {
		t.Errorf("a denial waits %v, more than the %v left of the minute: not a fixed window", d, left)
	}

	empty := filepath.Join(dir, "empty.yaml")
	os.WriteFile(empty, []byte("domain: nothing\n"), 0o644)
	startPoP(t, bin, "--listen", freeAddr(t), "--rules", empty, "--data", filepath.Join(dir, "data2"), "--envoy-compat")
}
