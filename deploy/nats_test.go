package deploy

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/edgelimit/edgelimit/deploy/lab"
	"github.com/edgelimit/edgelimit/replication"
	"github.com/edgelimit/edgelimit/replication/natstest"
)

// natsServerBin builds nats-server at the version go.mod names.
func natsServerBin(t *testing.T) string {
	return goBuild(t, "github.com/nats-io/nats-server/v2")
}

// Passwords as an operator would make them: letters and digits (a value of
// digits only would be read as a number; see hub-region.conf).
const (
	sysPassword   = "sys5Secret2Ky"
	probePassword = "probe4Secret1Wv"
)

// natsKeys runs edgelimit natsconf for topology into a new directory, as an
// operator would, and returns it. To the generated accounts it adds one user
// the test probes JetStream domains with (the PoPs' own permissions do not
// reach other domains' APIs, and should not).
func natsKeys(t *testing.T, topology string) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "keys")
	if out, err := exec.Command(edgelimitBin(t), "natsconf", "--topology", topology, "--keys", dir).CombinedOutput(); err != nil {
		t.Fatalf("edgelimit natsconf: %v\n%s", err, out)
	}
	file := filepath.Join(dir, "edgelimit-accounts.conf")
	text := template(t, file, readFile(t, file), "    users: [\n",
		fmt.Sprintf("    users: [\n      { user: probe, password: %s }\n", probePassword))
	if err := os.WriteFile(file, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

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
// 127.0.0.1). hub is the hub region's servers, for a leaf region. keys is
// what edgelimit natsconf wrote (natsKeys): each server gets
// keys/edgelimit-accounts.conf next to its config. The leaf links' TLS blocks
// are uncommented, as the files tell an operator to, with pki's server
// certificate.
func startRegion(t *testing.T, conf, region string, hub []*natsServer, keys string, pki natstest.PKI) []*natsServer {
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
			"# tls { cert_file: $NATS_TLS_CERT", "tls { cert_file: $NATS_TLS_CERT",
		}
		env := []string{
			"NATS_SERVER_NAME=" + s.name,
			"EDGELIMIT_REGION=" + region,
			"NATS_SYS_PASSWORD=" + sysPassword,
			"NATS_TLS_CERT=" + pki.ServerCert,
			"NATS_TLS_KEY=" + pki.ServerKey,
			"NATS_TLS_CA=" + pki.CAFile,
		}
		if err := os.MkdirAll(filepath.Join(dir, "keys"), 0o755); err != nil {
			t.Fatal(err)
		}
		accounts := readFile(t, filepath.Join(keys, "edgelimit-accounts.conf"))
		if err := os.WriteFile(filepath.Join(dir, "keys", "edgelimit-accounts.conf"), []byte(accounts), 0o644); err != nil {
			t.Fatal(err)
		}
		for i, o := range servers {
			env = append(env, fmt.Sprintf("NATS_ROUTE_%d=nats-route://127.0.0.1:%d", i+1, o.route))
		}
		hubKey, err := lab.LeafEnv(keys)
		if err != nil {
			t.Fatal(err)
		}
		if hub == nil {
			pairs = append(pairs, "listen: 0.0.0.0:7422", fmt.Sprintf("listen: 127.0.0.1:%d", s.lf))
			env = append(env, hubKey)
		} else {
			if err := lab.LeafRemote(keys, dir); err != nil { // keys/leaf-remote.conf beside the file
				t.Fatal(err)
			}
			env = append(env,
				fmt.Sprintf("EDGELIMIT_HUB_URL=nats-leaf://127.0.0.1:%d", hub[0].lf),
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

// waitJetStream waits until s lets the probe user in and its JetStream, in
// the domain named after the region, answers.
func waitJetStream(t *testing.T, s *natsServer, domain string) {
	t.Helper()
	waitFor(t, patience, s.name+" JetStream", func() error {
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
	waitFor(t, patience, "domain "+domain+" through "+s.name, func() error {
		got, err := jetStreamDomain(s, domain)
		if err == nil && got != domain {
			err = fmt.Errorf("answered by domain %q", got)
		}
		return err
	})
}

// jetStreamDomain asks, as the probe user connected to s, which JetStream
// domain answers: s's own, or with via set, domain via's through s.
func jetStreamDomain(s *natsServer, via string) (string, error) {
	return lab.JetStreamDomain(s.url(), "probe", probePassword, via)
}

// waitSourced waits until region's stream, asked about as the probe user
// through s (a server of the region), has set up its source of every other
// region's stream, and says how long that took after since.
//
// Two regions' PoPs create their streams about together, and the first
// stream's source asks for a stream that does not exist yet: the other
// (clustered) domain answers nothing to that request, and nats-server asks
// again only after 30 s and a 10 s backoff. Both are constants of
// nats-server (srcConsumerWaitTime, retryBackOff), not settings of its
// config, so the test cannot shorten them: whether the first try comes
// before the other stream exists is a race (it is made 100-200 ms after the
// stream), which a loaded machine loses, and then the source is up about 40
// s after the stream. Until then the PoP takes the other region's batches
// straight off their subjects (replication: stalled sources), which is not
// what this test checks; it waits for the source, not for a fixed time.
func waitSourced(t *testing.T, s *natsServer, region string, since time.Time) {
	t.Helper()
	stream := replication.StreamName(region)
	waitFor(t, patience, stream+"'s sources, through "+s.name, func() error {
		nc, err := nats.Connect(s.url(), nats.UserInfo("probe", probePassword), nats.Timeout(5*time.Second))
		if err != nil {
			return err
		}
		defer nc.Close()
		js, err := jetstream.NewWithDomain(nc, region)
		if err != nil {
			return err
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		st, err := js.Stream(ctx, stream)
		if err != nil {
			return err
		}
		sources := st.CachedInfo().Sources
		if len(sources) == 0 {
			return errors.New("the stream has no sources")
		}
		for _, si := range sources {
			switch {
			case si.Error != nil:
				return fmt.Errorf("source %s: %v", si.Name, si.Error)
			case si.Active < 0:
				return fmt.Errorf("source %s: not set up yet", si.Name)
			}
		}
		return nil
	})
	t.Logf("%s: its sources are up %v after the PoPs started", stream, time.Since(since).Round(100*time.Millisecond))
}

// TestNATSConfigsLinkRegions runs deploy/nats/hub-region.conf (region eu)
// and leaf-region.conf (region us) as an operator would — three nats-server
// processes per region, of the version go.mod names, secrets from the
// environment, the leaf links' seed from natsconf's keys/leaf-remote.conf
// beside the leaf regions' config, which includes it — with the hub
// server named in EDGELIMIT_HUB_URL stopped (SIGTERM) before the leaves
// start, so that they must log in to the other hub servers; the leaf links
// run over TLS (the files' tls
// blocks uncommented, certificates made by the test). Every PoP has its own
// nkey (edgelimit natsconf). One PoP per region (edgelimit pop --nats ...
// --nats-nkey <pop>.nk) counts a global limit: each side must apply the
// other's delta batches from its region's stream (sourced across the leaf
// link and the JetStream domains), and together they must stop at the limit.
// Then us-1's credential tries to publish eu-1's delta and a beacon of
// region eu: the servers refuse both.
func TestNATSConfigsLinkRegions(t *testing.T) {
	edgelimitBin(t) // build both binaries before any server starts
	natsServerBin(t)
	keys := natsKeys(t, "eu=eu-1;us=us-1")
	pki := natstest.NewPKI(t)
	hub := startRegion(t, "hub-region.conf", "eu", nil, keys, pki)
	// Losing one hub server keeps the regions linked. (Stopped as for
	// maintenance: a server killed outright stays a placement candidate of
	// the hub's JetStream for a while, and a stream placed on it does not
	// come up until it is back.)
	hub[0].p.terminate()
	leaf := startRegion(t, "leaf-region.conf", "us", hub, keys, pki)
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
	var env []string
	pop := func(region, name string, servers []*natsServer) string {
		listen := fmt.Sprintf("127.0.0.1:%d", freePort(t))
		var urls []string
		for _, s := range servers {
			urls = append(urls, s.url())
		}
		startPoP(t, name, listen, env, "--rules", rules, "--data", filepath.Join(dir, name),
			"--region", region, "--pop", name, "--topology", "eu=eu-1;us=us-1",
			"--nats", strings.Join(urls, ","), "--nats-nkey", filepath.Join(keys, name+".nk"),
			"--extrapolate=false") // decide on what was heard, so the counts below are exact
		return listen
	}
	popsStarted := time.Now()
	eu := pop("eu", "eu-1", hub[1:])
	us := pop("us", "us-1", leaf)
	waitSourced(t, hub[1], "eu", popsStarted)
	waitSourced(t, leaf[0], "us", popsStarted)

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
	waitFor(t, patience, "eu-1 sources us and reaches it", healthy(eu))
	waitFor(t, patience, "us-1 sources eu and reaches it", healthy(us))

	// us-1's credential may not speak for eu-1 or for region eu: the server
	// refuses the publish (and so nothing of it reaches a stream or a PoP).
	errs := make(chan error, 8)
	forger, err := nats.Connect(leaf[0].url(), nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { errs <- err }),
		nkeyOption(t, filepath.Join(keys, "us-1.nk")))
	if err != nil {
		t.Fatal(err)
	}
	defer forger.Close()
	for _, subject := range []string{"edgelimit.eu.delta.eu-1", "edgelimit._hello.eu.eu-1", "edgelimit.us.delta.us-2"} {
		if err := forger.Publish(subject, []byte("forged")); err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-errs:
			if !strings.Contains(err.Error(), "Permissions Violation for Publish to \""+subject+"\"") {
				t.Errorf("publish on %s as us-1: %v, want a permissions violation", subject, err)
			}
		case <-time.After(patience):
			t.Errorf("publish on %s as us-1: the server did not refuse it within %v", subject, patience)
		}
	}

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
	waitFor(t, patience, "eu-1 applies us-1's batches from its stream", applied(eu))
	for range limit / 2 {
		if code := check(t, eu, body); code != 200 {
			t.Fatalf("eu-1 denied a hit under the limit: %d", code)
		}
	}
	waitFor(t, patience, "us-1 applies eu-1's batches from its stream", applied(us))
	// Both have now heard all limit hits: the next one is denied on either side.
	for _, addr := range []string{eu, us} {
		waitFor(t, patience, addr+" denies past the global limit", func() error {
			if code := check(t, addr, body); code != 429 {
				return fmt.Errorf("status %d, want 429", code)
			}
			return nil
		})
	}

}

func nkeyOption(t *testing.T, seedFile string) nats.Option {
	t.Helper()
	o, err := nats.NkeyOptionFromSeed(seedFile)
	if err != nil {
		t.Fatal(err)
	}
	return o
}
