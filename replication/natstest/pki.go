package natstest

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
	"testing"
	"time"
)

// PKI is a CA and the PEM files of a server and a client certificate it
// signed, made for one test: the server's names 127.0.0.1 and localhost and
// serves TLS servers and clients alike (a NATS server both accepts and makes
// leaf connections); the client's is for PoPs.
type PKI struct {
	CAFile, ServerCert, ServerKey, ClientCert, ClientKey string
}

// NewPKI makes a PKI in a temporary directory of t, valid for an hour, for
// servers at 127.0.0.1 and localhost.
func NewPKI(t testing.TB) PKI {
	t.Helper()
	p, err := WritePKI(t.TempDir(), []net.IP{net.ParseIP("127.0.0.1")}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// WritePKI makes a PKI in dir: a CA, a server certificate for the
// addresses ips and the name localhost (for TLS servers and clients alike: a
// NATS server both accepts and makes leaf connections), and a client
// certificate for PoPs, valid from an hour ago for validFor.
func WritePKI(dir string, ips []net.IP, validFor time.Duration) (PKI, error) {
	var err error
	write := func(name, typ string, der []byte) string {
		path := filepath.Join(dir, name)
		if err == nil {
			err = os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600)
		}
		return path
	}
	key := func() *ecdsa.PrivateKey {
		k, kerr := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err == nil {
			err = kerr
		}
		return k
	}
	now := time.Now()
	caKey := key()
	if err != nil {
		return PKI{}, err
	}
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "edgelimit test CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(validFor), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return PKI{}, err
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return PKI{}, err
	}
	leaf := func(serial int64, name string, usage ...x509.ExtKeyUsage) (string, string) {
		k := key()
		if err != nil {
			return "", ""
		}
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: name},
			NotBefore: now.Add(-time.Hour), NotAfter: now.Add(validFor), KeyUsage: x509.KeyUsageDigitalSignature,
			ExtKeyUsage: usage, IPAddresses: ips, DNSNames: []string{"localhost"}}
		der, cerr := x509.CreateCertificate(rand.Reader, tmpl, ca, &k.PublicKey, caKey)
		if cerr != nil {
			err = cerr
			return "", ""
		}
		kder, merr := x509.MarshalECPrivateKey(k)
		if merr != nil {
			err = merr
			return "", ""
		}
		return write(name+".pem", "CERTIFICATE", der), write(name+"-key.pem", "EC PRIVATE KEY", kder)
	}
	p := PKI{CAFile: write("ca.pem", "CERTIFICATE", caDER)}
	p.ServerCert, p.ServerKey = leaf(2, "nats-server", x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth)
	p.ClientCert, p.ClientKey = leaf(3, "edgelimit-pop", x509.ExtKeyUsageClientAuth)
	if err != nil {
		return PKI{}, err
	}
	return p, nil
}
