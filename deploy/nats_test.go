package deploy

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/edgelimit/edgelimit/deploy/lab"
)

// natsServerBin builds nats-server at the version go.mod names.
func natsServerBin(t *testing.T) string {
	return goBuild(t, "github.com/nats-io/nats-server/v2")
}

// Passwords as an operator would make them: letters and digits (a value of
// digits only would be read as a number; see hub-region.conf).
const (
	popPassword  = "pop7Secret9Xq"
	leafPassword = "leaf3Secret8Zw"
	sysPassword  = "sys5Secret2Ky"
)

// natsServer is one server of a region started from a deploy/nats config.
type natsServer struct {
	name              string
	client, route, lf int // ports: client, cluster route, leaf listener (hub only)
	p                 *proc
}

func (s *natsServer) url() string { return fmt.Sprintf("nats://127.0.0.1:%d", s.client) }

// startRegion starts three servers of a region from the config file conf
// (deploy/nats/hub-region.conf or leaf-region.conf) as an operator would:
// what the file takes from the environment (server name, region, routes,
// hub URLs, passwords) set there, and only the listen addresses, store
// directory and size replaced in the text (every server here is on
// 127.0.0.1). hub is the hub region's servers, for a leaf region.
func startRegion(t *testing.T, conf, region string, hub []*natsServer) []*natsServer {
	t.Helper()
	bin := natsServerBin(t)
	text := readRepoFile(t, "deploy/nats/"+conf)
	servers := make([]*natsServer, 3)
	for i := range servers {
		s := &natsServer{name: fmt.Sprintf("nats-%s-%d", region, i+1), client: freePort(t), route: freePort(t)}
		if hub == nil {
			s.lf = freePort(t)
		}
		servers[i] = s
	}
	for _, s := range servers {
		dir := t.TempDir()
		pairs := []string{
			"listen: 0.0.0.0:4222", fmt.Sprintf("listen: 127.0.0.1:%d", s.client),
			"listen: 0.0.0.0:6222", fmt.Sprintf("listen: 127.0.0.1:%d", s.route),
			"store_dir: /var/lib/nats/jetstream", "store_dir: " + filepath.Join(dir, "jetstream"),
			"max_file_store: 10G", "max_file_store: 256M",
		}
		env := []string{
			"NATS_SERVER_NAME=" + s.name,
			"EDGELIMIT_REGION=" + region,
			"EDGELIMIT_NATS_PASSWORD=" + popPassword,
			"NATS_SYS_PASSWORD=" + sysPassword,
		}
		for i, o := range servers {
			env = append(env, fmt.Sprintf("NATS_ROUTE_%d=nats-route://127.0.0.1:%d", i+1, o.route))
		}
		if hub == nil {
			pairs = append(pairs, "listen: 0.0.0.0:7422", fmt.Sprintf("listen: 127.0.0.1:%d", s.lf))
			env = append(env, "EDGELIMIT_LEAF_PASSWORD="+leafPassword)
		} else {
			env = append(env,
				fmt.Sprintf("EDGELIMIT_HUB_URL=nats-leaf://leaf:%s@127.0.0.1:%d", leafPassword, hub[0].lf),
				fmt.Sprintf("EDGELIMIT_HUB_URL_2=nats-leaf://127.0.0.1:%d", hub[1].lf),
				fmt.Sprintf("EDGELIMIT_HUB_URL_3=nats-leaf://127.0.0.1:%d", hub[2].lf))
		}
		if err := lab.CheckEnv(conf, text, env); err != nil {
			t.Fatal(err)
		}
		file := filepath.Join(dir, conf)
		if err := os.WriteFile(file, []byte(template(t, conf, text, pairs...)), 0o600); err != nil {
			t.Fatal(err)
		}
		s.p = start(t, s.name, bin, env, "-c", file)
	}
	for _, s := range servers {
		waitJetStream(t, s, region)
	}
	return servers
}

// waitJetStream waits until s accepts the PoPs' user and its JetStream, in
// the domain named after the region, answers.
func waitJetStream(t *testing.T, s *natsServer, domain string) {
	t.Helper()
	waitFor(t, 30*time.Second, s.name+" JetStream", func() error {
		if s.p.exited() {
			t.Fatalf("%s exited", s.name)
		}
		got, err := jetStreamDomain(s, "")
		if err == nil && got != domain {
			err = fmt.Errorf("JetStream domain %q, want %q", got, domain)
		}
		return err
	})
}

// waitDomain waits until JetStream domain answers through server s.
func waitDomain(t *testing.T, s *natsServer, domain string) {
	t.Helper()
	waitFor(t, 30*time.Second, "domain "+domain+" through "+s.name, func() error {
		got, err := jetStreamDomain(s, domain)
		if err == nil && got != domain {
			err = fmt.Errorf("answered by domain %q", got)
		}
		return err
	})
}

// jetStreamDomain asks, as the PoPs' user connected to s, which JetStream
// domain answers: s's own, or with via set, domain via's through s.
func jetStreamDomain(s *natsServer, via string) (string, error) {
	return lab.JetStreamDomain(s.url(), "edgelimit", popPassword, via)
}

// TestNATSConfigsLinkRegions runs deploy/nats/hub-region.conf (region eu)
// and leaf-region.conf (region us) as an operator would — three nats-server
// processes per region, of the version go.mod names, passwords from the
// environment — with the hub server named in EDGELIMIT_HUB_URL stopped (SIGTERM) before
// the leaves start, so that they must log in to the other hub servers with
// the credentials of that URL. Then one PoP per region (edgelimit pop
// --nats ... --nats-user edgelimit, the password from
// EDGELIMIT_NATS_PASSWORD) counts a global limit: each side must apply the
// other's delta batches from its region's stream (sourced across the leaf
// link and the JetStream domains), and together they must stop at the limit.
func TestNATSConfigsLinkRegions(t *testing.T) {
	edgelimitBin(t) // build both binaries before any server starts
	natsServerBin(t)
	hub := startRegion(t, "hub-region.conf", "eu", nil)
	// Losing one hub server keeps the regions linked. (Stopped as for
	// maintenance: a server killed outright stays a placement candidate of
	// the hub's JetStream for a while, and a stream placed on it does not
	// come up until it is back.)
	hub[0].p.terminate()
	leaf := startRegion(t, "leaf-region.conf", "us", hub)
	// Every server reaches the other region's JetStream domain, which only
	// a leaf link carries, before any PoP creates a stream: a source consumer
	// requested across a link not yet up is retried only after 30 s.
	for _, s := range leaf {
		waitDomain(t, s, "eu")
	}
	for _, s := range hub[1:] {
		waitDomain(t, s, "us")
	}

	dir := t.TempDir()
	rules := filepath.Join(dir, "rules.yaml")
	const limit = 10
	if err := os.WriteFile(rules, fmt.Appendf(nil, `domain: edge
descriptors:
  - key: api_key
    rate_limit: {unit: hour, requests_per_unit: %d, scope: global}
`, limit), 0o644); err != nil {
		t.Fatal(err)
	}
	env := []string{"EDGELIMIT_NATS_PASSWORD=" + popPassword}
	pop := func(region, name string, servers []*natsServer) string {
		listen := fmt.Sprintf("127.0.0.1:%d", freePort(t))
		var urls []string
		for _, s := range servers {
			urls = append(urls, s.url())
		}
		startPoP(t, name, listen, env, "--rules", rules, "--data", filepath.Join(dir, name),
			"--region", region, "--pop", name, "--topology", "eu=eu-1;us=us-1",
			"--nats", strings.Join(urls, ","), "--nats-user", "edgelimit",
			"--extrapolate=false") // decide on what was heard, so the counts below are exact
		return listen
	}
	eu := pop("eu", "eu-1", hub[1:])
	us := pop("us", "us-1", leaf)

	healthy := func(addr string) func() error {
		return func() error {
			s, err := scrape(addr)
			if err != nil {
				return err
			}
			if v, err := metric(s, "edgelimit_replication_stalled_sources"); err != nil || v != 0 {
				return fmt.Errorf("stalled sources %v (%v)", v, err)
			}
			if v, err := metric(s, "edgelimit_global_share"); err != nil || v != 1 {
				return fmt.Errorf("global share %v (%v)", v, err)
			}
			return nil
		}
	}
	waitFor(t, 30*time.Second, "eu-1 sources us and reaches it", healthy(eu))
	waitFor(t, 30*time.Second, "us-1 sources eu and reaches it", healthy(us))

	const body = `{"domain":"edge","descriptors":[{"entries":[{"key":"api_key","value":"k"}]}]}`
	applied := func(addr string) func() error {
		return func() error {
			s, err := scrape(addr)
			if err != nil {
				return err
			}
			if v, err := metric(s, "edgelimit_replication_applied_batches_total"); err != nil || v == 0 {
				return fmt.Errorf("applied batches from the stream: %v (%v)", v, err)
			}
			return nil
		}
	}
	for range limit / 2 {
		if code := check(t, us, body); code != 200 {
			t.Fatalf("us-1 denied a hit under the limit: %d", code)
		}
	}
	waitFor(t, 20*time.Second, "eu-1 applies us-1's batches from its stream", applied(eu))
	for range limit / 2 {
		if code := check(t, eu, body); code != 200 {
			t.Fatalf("eu-1 denied a hit under the limit: %d", code)
		}
	}
	waitFor(t, 20*time.Second, "us-1 applies eu-1's batches from its stream", applied(us))
	// Both have now heard all limit hits: the next one is denied on either side.
	for _, addr := range []string{eu, us} {
		waitFor(t, 10*time.Second, addr+" denies past the global limit", func() error {
			if code := check(t, addr, body); code != 429 {
				return fmt.Errorf("status %d, want 429", code)
			}
			return nil
		})
	}
}
