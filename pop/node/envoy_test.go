package node

import (
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A PoP serves Envoy's /json beside /v1/check, takes protobuf JSON on
// /v1/check, and with MergeDomains loads one domain from two files (which
// fails without it).
func TestRunEnvoyJSONAndMergedDomains(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "a.yaml"), []byte("domain: d\ndescriptors:\n  - key: ip\n    rate_limit: {unit: minute, requests_per_unit: 5}\n"), 0o644)
	os.WriteFile(filepath.Join(dir, "b.yaml"), []byte("domain: d\ndescriptors:\n  - key: user\n    rate_limit: {unit: week, requests_per_unit: 7}\n"), 0o644)
	if err := Run(t.Context(), Config{Rules: []string{dir}, DataDir: t.TempDir(), Listen: "127.0.0.1:0"}); err == nil || !strings.Contains(err.Error(), "--merge-domains") {
		t.Fatalf("two files of one domain without MergeDomains: %v", err)
	}
	base, _, _ := start(t, Config{Rules: []string{dir}, DataDir: t.TempDir(), MergeDomains: true})
	post := func(path, body string) (int, string) {
		resp, err := http.Post(base+path, "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		// protojson may put a space after a comma; the values here hold none.
		return resp.StatusCode, strings.ReplaceAll(string(b), " ", "")
	}
	code, body := post("/json", `{"domain":"d","hitsAddend":2,"descriptors":[{"entries":[{"key":"user","value":"u"}]}]}`)
	if code != 200 || !strings.Contains(body, `"unit":"WEEK"`) || !strings.Contains(body, `"limitRemaining":5`) {
		t.Fatalf("/json: %d %s", code, body)
	}
	code, body = post("/v1/check", `{"domain":"d","descriptors":[{"entries":[{"key":"ip","value":"1.2.3.4"}],"hitsAddend":"4"}]}`)
	if code != 200 || !strings.Contains(body, `"limit_remaining":1`) {
		t.Fatalf("/v1/check with protobuf JSON: %d %s", code, body)
	}
}
