package replication_test

import (
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/edgelimit/edgelimit/crdt/crdttest"
	"github.com/edgelimit/edgelimit/replication"
	"github.com/edgelimit/edgelimit/replication/natstest"
)

// startTLSServer starts a real NATS server with JetStream that speaks only
// TLS and requires a client certificate signed by the test CA.
func startTLSServer(t testing.TB, p natstest.PKI) *server.Server {
	t.Helper()
	tc, err := server.GenTLSConfig(&server.TLSConfigOpts{CertFile: p.ServerCert, KeyFile: p.ServerKey, CaFile: p.CAFile, Verify: true})
	if err != nil {
		t.Fatal(err)
	}
	s, err := server.NewServer(&server.Options{ServerName: "tls", Host: "127.0.0.1", Port: -1, JetStream: true,
		StoreDir: t.TempDir(), TLSConfig: tc, TLSVerify: true, TLSTimeout: 2, NoSigs: true, NoLog: true})
	if err != nil {
		t.Fatal(err)
	}
	s.Start()
	t.Cleanup(s.Shutdown)
	if err := replication.WaitReady(s, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	return s
}

// TestTLS: PoPs replicate through a NATS server that requires TLS and client
// certificates, given the CA, certificate and key files (--nats-tls-ca,
// --nats-tls-cert, --nats-tls-key); a client that does not know the CA, or
// has no certificate, is not let in.
func TestTLS(t *testing.T) {
	p := natstest.NewPKI(t)
	s := startTLSServer(t, p)
	url := strings.Replace(s.ClientURL(), "nats://", "tls://", 1)

	for _, c := range []struct {
		name string
		cfg  replication.ConnConfig
		want string
	}{
		{"no CA", replication.ConnConfig{URL: url, CertFile: p.ClientCert, KeyFile: p.ClientKey}, "certificate"},
		{"no client certificate", replication.ConnConfig{URL: url, CAFile: p.CAFile}, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			c.cfg.Logger = testLogger(t)
			nc, err := replication.Connect(c.cfg)
			if err == nil {
				defer nc.Close()
				time.Sleep(500 * time.Millisecond) // Connect retries in the background: give it the chance
				if nc.IsConnected() {
					t.Fatal("connected")
				}
				return
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err %v, want one about %q", err, c.want)
			}
		})
	}

	topo := topology(map[string][]string{"eu": {"fra1", "par1"}})
	var pops []*pop
	for _, name := range []string{"fra1", "par1"} {
		nc, err := replication.Connect(replication.ConnConfig{URL: url, Name: name, CAFile: p.CAFile, CertFile: p.ClientCert, KeyFile: p.ClientKey, Logger: testLogger(t)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		if !nc.IsConnected() || !nc.TLSRequired() {
			t.Fatalf("%s: connected %v, TLS %v", name, nc.IsConnected(), nc.TLSRequired())
		}
		counts := newMemCounts(name)
		rep, stop := runReplicator(t, replication.Config{Region: "eu", POP: name, Topology: topo, Conn: nc, Counts: counts, Logger: testLogger(t)})
		pops = append(pops, &pop{name: name, region: "eu", counts: counts, rep: rep, stop: stop})
	}
	var o crdttest.Oracle
	addRandom(newRand(t), pops, 10, 100, &o)
	converge(t, 5*time.Second, &o, pops...)
}
