package deploy

import (
	"fmt"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// TestTraefikExample checks deploy/examples/traefik/dynamic.yml without a
// Traefik: every router chains a headers middleware that sets
// X-Edgelimit-Domain to a forward_auth domain of the example rules before
// its forwardAuth middleware; forwardAuth forwards that header and every
// header a "header:<Name>" source reads, and puts nothing in the query
// string (which /v1/authz ignores). Then it sends a real PoP, loaded with
// the example rules and a second forward_auth domain, the auth request
// Traefik would build from that file: it must be decided (200 with rate
// limit headers), where the old ?domain= form got 400.
func TestTraefikExample(t *testing.T) {
	var cfg struct {
		HTTP struct {
			Routers map[string]struct {
				Middlewares []string `yaml:"middlewares"`
			} `yaml:"routers"`
			Middlewares map[string]struct {
				Headers *struct {
					CustomRequestHeaders map[string]string `yaml:"customRequestHeaders"`
				} `yaml:"headers"`
				ForwardAuth *struct {
					Address            string   `yaml:"address"`
					AuthRequestHeaders []string `yaml:"authRequestHeaders"`
				} `yaml:"forwardAuth"`
			} `yaml:"middlewares"`
		} `yaml:"http"`
	}
	if err := yaml.Unmarshal([]byte(readRepoFile(t, "deploy/examples/traefik/dynamic.yml")), &cfg); err != nil {
		t.Fatal(err)
	}
	rulesText := readRepoFile(t, "deploy/examples/rules.yaml")
	domain := regexp.MustCompile(`(?m)^domain: (\S+)`).FindStringSubmatch(rulesText)[1]
	var sources []string
	for _, m := range regexp.MustCompile(`from: "header:([A-Za-z0-9-]+)"`).FindAllStringSubmatch(rulesText, -1) {
		sources = append(sources, m[1])
	}

	type authRequest struct {
		address string
		headers http.Header // what the chain puts on the auth request
	}
	var reqs []authRequest
	for name, r := range cfg.HTTP.Routers {
		set := http.Header{}
		for _, mw := range r.Middlewares {
			m, ok := cfg.HTTP.Middlewares[mw]
			if !ok {
				t.Fatalf("router %s uses middleware %s, which is not defined", name, mw)
			}
			if m.Headers != nil {
				for k, v := range m.Headers.CustomRequestHeaders {
					set.Set(k, v)
				}
			}
			if fa := m.ForwardAuth; fa != nil {
				u, err := url.Parse(fa.Address)
				if err != nil || u.Path != "/v1/authz" || u.RawQuery != "" {
					t.Errorf("forwardAuth %s: address %q: want .../v1/authz with no query (the domain goes in X-Edgelimit-Domain)", mw, fa.Address)
				}
				if set.Get("X-Edgelimit-Domain") != domain {
					t.Errorf("router %s: X-Edgelimit-Domain is %q before forwardAuth %s, want the rules' domain %q", name, set.Get("X-Edgelimit-Domain"), mw, domain)
				}
				fwd := http.Header{}
				for _, h := range fa.AuthRequestHeaders {
					if v := set.Get(h); v != "" {
						fwd.Set(h, v)
					}
				}
				for _, h := range append([]string{"X-Edgelimit-Domain"}, sources...) {
					if !slices.ContainsFunc(fa.AuthRequestHeaders, func(s string) bool { return strings.EqualFold(s, h) }) {
						t.Errorf("forwardAuth %s does not forward %s", mw, h)
					}
				}
				reqs = append(reqs, authRequest{fa.Address, fwd})
			}
		}
	}
	if len(reqs) == 0 {
		t.Fatal("no router uses a forwardAuth middleware")
	}

	// A PoP with the example rules and a second forward_auth domain.
	dir := t.TempDir()
	for name, text := range map[string]string{
		"rules.yaml": rulesText,
		"other.yaml": "domain: other\ndescriptors:\n  - key: ip\n    rate_limit: {unit: second, requests_per_unit: 5}\nforward_auth:\n  descriptors:\n    - entries: [{key: ip, from: client_ip}]\n",
	} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	listen := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	startPoP(t, "pop", listen, nil, "--rules", dir, "--data", filepath.Join(dir, "data"))
	send := func(address string, h http.Header) *http.Response {
		u, _ := url.Parse(address)
		req, _ := http.NewRequest("GET", "http://"+listen+u.RequestURI(), nil)
		for k, v := range h {
			req.Header[k] = v
		}
		// What ForwardAuth adds itself, and a client's API key.
		req.Header.Set("X-Forwarded-Method", "GET")
		req.Header.Set("X-Forwarded-Uri", "/api/v1/things")
		req.Header.Set("X-Forwarded-For", "203.0.113.7")
		req.Header.Set("X-API-Key", "key-1")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp
	}
	for _, r := range reqs {
		h := r.headers.Clone()
		h.Del("X-API-Key")
		resp := send(r.address, h)
		if resp.StatusCode != http.StatusOK || resp.Header.Get("X-RateLimit-Limit") == "" {
			t.Errorf("auth request as %s sends it: %s, X-RateLimit-Limit %q; want 200 with rate limit headers", r.address, resp.Status, resp.Header.Get("X-RateLimit-Limit"))
		}
	}
	if resp := send("http://edgelimit:8080/v1/authz?domain="+domain, nil); resp.StatusCode != http.StatusBadRequest {
		t.Errorf("the old ?domain= form: %s, want 400 (the query string does not pick the domain)", resp.Status)
	}
}
