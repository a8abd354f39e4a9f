package replication_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/edgelimit/edgelimit/crdt/crdttest"
	"github.com/edgelimit/edgelimit/replication"
)

// testPKI is a CA and the files of a server and a client certificate it
// signed, made for one test.
type testPKI struct {
	caFile, serverCert, serverKey, clientCert, clientKey string
}

func newPKI(t testing.TB) testPKI {
	t.Helper()
	dir := t.TempDir()
	write := func(name, typ string, der []byte) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	key := func() *ecdsa.PrivateKey {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	now := time.Now()
	caKey := key()
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "edgelimit test CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	leaf := func(serial int64, name string, usage x509.ExtKeyUsage) (string, string) {
		k := key()
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: name},
			NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour), KeyUsage: x509.KeyUsageDigitalSignature,
			ExtKeyUsage: []x509.ExtKeyUsage{usage}, IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, DNSNames: []string{"localhost"}}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &k.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		kder, err := x509.MarshalECPrivateKey(k)
		if err != nil {
			t.Fatal(err)
		}
		return write(name+".pem", "CERTIFICATE", der), write(name+"-key.pem", "EC PRIVATE KEY", kder)
	}
	p := testPKI{caFile: write("ca.pem", "CERTIFICATE", caDER)}
	p.serverCert, p.serverKey = leaf(2, "nats-server", x509.ExtKeyUsageServerAuth)
	p.clientCert, p.clientKey = leaf(3, "edgelimit-pop", x509.ExtKeyUsageClientAuth)
	return p
}

// startTLSServer starts a real NATS server with JetStream that speaks only
// TLS and requires a client certificate signed by the test CA.
func startTLSServer(t testing.TB, p testPKI) *server.Server {
	t.Helper()
	tc, err := server.GenTLSConfig(&server.TLSConfigOpts{CertFile: p.serverCert, KeyFile: p.serverKey, CaFile: p.caFile, Verify: true})
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
	p := newPKI(t)
	s := startTLSServer(t, p)
	url := strings.Replace(s.ClientURL(), "nats://", "tls://", 1)

	for _, c := range []struct {
		name string
		cfg  replication.ConnConfig
		want string
	}{
		{"no CA", replication.ConnConfig{URL: url, CertFile: p.clientCert, KeyFile: p.clientKey}, "certificate"},
		{"no client certificate", replication.ConnConfig{URL: url, CAFile: p.caFile}, ""},
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
		nc, err := replication.Connect(replication.ConnConfig{URL: url, Name: name, CAFile: p.caFile, CertFile: p.clientCert, KeyFile: p.clientKey, Logger: testLogger(t)})
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
