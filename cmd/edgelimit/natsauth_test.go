package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestNatsconf: natsconf writes a seed per PoP (mode 0600) and keeps them
// on a second run; the PoP flags that use them refuse what cannot work, each
// with an error naming the flag.
func TestNatsconf(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "keys")
	var out, errb bytes.Buffer
	if code := run([]string{"natsconf", "--topology", "eu=eu-1,eu-2;us=us-1", "--keys", dir}, &out, &errb); code != 0 {
		t.Fatalf("natsconf: exit %d: %s", code, errb.String())
	}
	seed, err := os.ReadFile(filepath.Join(dir, "eu-1.nk"))
	if err != nil {
		t.Fatal(err)
	}
	if st, _ := os.Stat(filepath.Join(dir, "eu-1.nk")); st.Mode().Perm() != 0o600 {
		t.Errorf("seed mode %v, want 0600", st.Mode().Perm())
	}
	authorized, _ := os.ReadFile(filepath.Join(dir, "authorized_keys"))
	conf, _ := os.ReadFile(filepath.Join(dir, "edgelimit-accounts.conf"))
	if strings.Contains(string(conf), strings.TrimSpace(string(seed))) || strings.Contains(string(authorized), strings.TrimSpace(string(seed))) {
		t.Fatal("a seed leaked into a generated file")
	}
	for _, name := range []string{"admin.nk", "leaf.nk"} {
		if st, err := os.Stat(filepath.Join(dir, name)); err != nil || st.Mode().Perm() != 0o600 {
			t.Errorf("%s: %v, mode %v, want a seed of mode 0600", name, err, st.Mode().Perm())
		}
	}
	for _, user := range []string{"_admin ", "_leaf "} {
		if !strings.Contains(string(authorized), "\n"+user) {
			t.Errorf("authorized_keys has no %q line:\n%s", user, authorized)
		}
	}
	// leaf.pub is leaf.nk's public key, for a hub of nats-servers.
	leafPub, _ := os.ReadFile(filepath.Join(dir, "leaf.pub"))
	if pub := strings.TrimSpace(string(leafPub)); pub == "" || !strings.Contains(string(authorized), "\n_leaf "+pub+"\n") {
		t.Errorf("leaf.pub %q is not the _leaf key of authorized_keys:\n%s", leafPub, authorized)
	}
	// leaf-remote.conf is leaf.nk's seed as a leaf remote's nkey setting,
	// a secret like leaf.nk.
	leafSeed, _ := os.ReadFile(filepath.Join(dir, "leaf.nk"))
	remote, err := os.ReadFile(filepath.Join(dir, "leaf-remote.conf"))
	if err != nil || !strings.Contains(string(remote), "\nnkey: "+strings.TrimSpace(string(leafSeed))+"\n") {
		t.Errorf("leaf-remote.conf (%v) does not set nkey to leaf.nk's seed:\n%s", err, remote)
	}
	if st, err := os.Stat(filepath.Join(dir, "leaf-remote.conf")); err != nil || st.Mode().Perm() != 0o600 {
		t.Errorf("leaf-remote.conf: %v, want mode 0600", err)
	}
	// No PoP may administer a stream: only the operator's key has the
	// JetStream API beyond creating its region's stream.
	for _, line := range strings.Split(string(conf), "\n") {
		if strings.Contains(line, "STREAM.UPDATE") || strings.Contains(line, "STREAM.DELETE") || strings.Contains(line, "STREAM.PURGE") {
			t.Errorf("the accounts config grants stream administration: %s", line)
		}
	}
	if strings.Count(string(conf), `"$JS.API.>"`) != 1 {
		t.Errorf("the accounts config should grant the whole JetStream API to the operator's key alone:\n%s", conf)
	}
	out.Reset()
	if code := run([]string{"natsconf", "--topology", "eu=eu-1,eu-2;us=us-1", "--keys", dir}, &out, &errb); code != 0 || strings.Contains(out.String(), "new seed") {
		t.Fatalf("second run: exit %d, made new seeds: %s", code, out.String())
	}
	if again, _ := os.ReadFile(filepath.Join(dir, "authorized_keys")); !bytes.Equal(again, authorized) {
		t.Fatal("a second run changed the public keys")
	}

	rules := filepath.Join("..", "..", "deploy", "examples", "rules.yaml")
	// A port of its own: the default 127.0.0.1:8080 may be held by a PoP of
	// `make run`, and a check that comes after the listen would then fail on it.
	base := []string{"pop", "--listen", "127.0.0.1:0", "--region", "eu", "--pop", "eu-1", "--topology", "eu=eu-1,eu-2;us=us-1", "--rules", rules, "--data", t.TempDir()}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--nats-authorized-keys", filepath.Join(dir, "authorized_keys")}, "give this PoP's seed with --nats-nkey"},
		{[]string{"--nats-authorized-keys", filepath.Join(dir, "authorized_keys"), "--nats-nkey", filepath.Join(dir, "eu-2.nk")}, "but --nats-nkey's public key is"},
		{[]string{"--nats-authorized-keys", filepath.Join(dir, "eu-1.nk"), "--nats-nkey", filepath.Join(dir, "eu-1.nk")}, "--nats-authorized-keys"},
		{[]string{"--nats", "nats://127.0.0.1:1", "--nats-authorized-keys", filepath.Join(dir, "authorized_keys")}, "configures the embedded NATS server"},
		{[]string{"--nats-tls-cert", "c.pem"}, "--nats-tls-cert and --nats-tls-key go together"},
		{[]string{"--nats-password-file", filepath.Join(dir, "missing")}, "--nats-password-file"},
		{[]string{"--nats-host", "0.0.0.0"}, "refusing to serve NATS beyond loopback without credentials"},
		{[]string{"--nats-leaf-port", "-1", "--nats-leaf-host", "0.0.0.0"}, "would accept leaf connections on 0.0.0.0"},
		{[]string{"--nats-leaf-nkey", filepath.Join(dir, "leaf.nk")}, "--nats-leaf-nkey is the credential of the leaf links: it needs --nats-leaf-remote"},
		{[]string{"--nats-leaf-remote", "nats-leaf://127.0.0.1:1", "--nats-leaf-nkey", filepath.Join(dir, "authorized_keys")}, "--nats-leaf-nkey"},
		{[]string{"--nats-max-store-mib", "-1"}, "--nats-max-store-mib must be between 0"},
		{[]string{"--nats-port", "4222"}, "without --nats-authorized-keys the embedded NATS server has no client port"},
		{[]string{"--nats-allow-anonymous", "--nats-authorized-keys", filepath.Join(dir, "authorized_keys"), "--nats-nkey", filepath.Join(dir, "eu-1.nk")}, "contradict"},
		{[]string{"--nats", "nats://127.0.0.1:1", "--nats-allow-anonymous"}, "with --nats there is no embedded server"},
	} {
		errb.Reset()
		if code := run(append(append([]string{}, base...), c.args...), &out, &errb); code != 1 || !strings.Contains(errb.String(), c.want) {
			t.Errorf("%v: exit %d, stderr %q, want %q", c.args, code, errb.String(), c.want)
		}
	}
}
