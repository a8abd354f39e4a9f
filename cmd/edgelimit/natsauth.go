package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"

	"github.com/nats-io/nkeys"

	"github.com/edgelimit/edgelimit/replication"
)

// natsAuthFlags registers the flags of NATS credentials and TLS beyond the
// basic ones in pop.go. Secrets come from files, never from argv.
func (f *replFlags) natsAuthFlags(fs *flag.FlagSet) {
	fs.StringVar(&f.natsPassFile, "nats-password-file", "", "`file` holding the NATS password (keeps it off the command line; --nats-password and\nEDGELIMIT_NATS_PASSWORD also work)")
	fs.StringVar(&f.natsCA, "nats-tls-ca", "", "CA `file` to verify the NATS servers' certificates with (requires TLS); --nats-ca is the same")
	fs.StringVar(&f.natsCert, "nats-tls-cert", "", "client certificate `file` to present to NATS servers that verify clients (with --nats-tls-key)")
	fs.StringVar(&f.natsKey, "nats-tls-key", "", "private key `file` of --nats-tls-cert")
	fs.StringVar(&f.natsHost, "nats-host", "127.0.0.1", "embedded NATS: the `host` its client port binds; beyond loopback it needs --nats-authorized-keys")
	fs.Int64Var(&f.maxStoreMiB, "nats-max-store-mib", 0, "JetStream's file store limit of the embedded NATS server (MiB; 0: 1024); the region's stream is capped at 3/4\nof it and discards its oldest messages past that, so publishes are not refused. With --nats, 0 leaves the\nstream uncapped, and a value caps it at 3/4 of it: keep that under the servers' max_file_store")
	fs.StringVar(&f.natsAdminNKey, "nats-admin-nkey", "", "operator's nkey seed `file` ('edgelimit natsconf' writes admin.nk): the PoP creates and updates its region's\nstream through it (a PoP's own credential may only create a missing one; an embedded server needs none)")
	fs.StringVar(&f.leafHost, "nats-leaf-host", "127.0.0.1", "embedded NATS: the `host` the leaf listener (--nats-leaf-port) binds; beyond loopback it needs --nats-authorized-keys")
	fs.StringVar(&f.leafNKey, "nats-leaf-nkey", "", "embedded NATS: nkey seed `file` the leaf links (--nats-leaf-remote) log in to the hub with ('edgelimit natsconf'\nwrites leaf.nk; the hub's --nats-authorized-keys lists it)")
	fs.StringVar(&f.natsAuthorized, "nats-authorized-keys", "", "embedded NATS: let in only the PoPs listed in this `file` (\"<pop> <public nkey>\" lines, written by\n'edgelimit natsconf'), each allowed to publish only its own subjects; this PoP connects with --nats-nkey")
	fs.BoolVar(&f.natsAnonymous, "nats-allow-anonymous", false, "embedded NATS without --nats-authorized-keys: open its client port (--nats-port, on loopback) to clients without\ncredentials, which may then publish any PoP's counts; for a second server of this PoP on the same machine\n(--nats nats://127.0.0.1:<port>). Without it (the default) that server has no client port and this PoP\nconnects in process")
}

// defaultMaxStore is the embedded NATS server's JetStream store limit when
// --nats-max-store-mib is 0.
const defaultMaxStore = 1 << 30

// validateAuth checks the credential and TLS flags and reads the authorized
// keys; it runs after validate.
func (f *replFlags) validateAuth(t replication.Topology) error {
	if f.maxStoreMiB < 0 || f.maxStoreMiB > 1<<30 {
		return fmt.Errorf("--nats-max-store-mib must be between 0 and %d, got %d", 1<<30, f.maxStoreMiB)
	}
	f.maxStore = f.maxStoreMiB << 20
	if f.maxStore == 0 && f.natsURL == "" {
		f.maxStore = defaultMaxStore
	}
	if f.natsPassFile != "" {
		if f.natsPass != "" {
			return errors.New("--nats-password-file and --nats-password (or EDGELIMIT_NATS_PASSWORD) both set; keep one")
		}
		b, err := os.ReadFile(f.natsPassFile)
		if err != nil {
			return fmt.Errorf("--nats-password-file: %w", err)
		}
		if f.natsPass = strings.TrimRight(string(b), "\r\n"); f.natsPass == "" {
			return fmt.Errorf("--nats-password-file %s is empty", f.natsPassFile)
		}
	}
	if f.leafNKey != "" {
		if len(f.leafRemotes.values) == 0 {
			return errors.New("--nats-leaf-nkey is the credential of the leaf links: it needs --nats-leaf-remote")
		}
		if err := checkSeed(f.leafNKey); err != nil {
			return fmt.Errorf("--nats-leaf-nkey: %w", err)
		}
	}
	if f.natsAdminNKey != "" {
		if err := checkSeed(f.natsAdminNKey); err != nil {
			return fmt.Errorf("--nats-admin-nkey: %w", err)
		}
	}
	if (f.natsCert == "") != (f.natsKey == "") {
		return errors.New("--nats-tls-cert and --nats-tls-key go together")
	}
	if f.natsAnonymous {
		switch {
		case f.natsURL != "":
			return errors.New("--nats-allow-anonymous opens the embedded NATS server's client port; with --nats there is no embedded server")
		case f.natsAuthorized != "":
			return errors.New("--nats-allow-anonymous and --nats-authorized-keys contradict each other: the keys let in only the PoPs listed")
		}
	}
	if f.natsURL == "" && f.natsAuthorized == "" && !f.natsAnonymous && f.natsListen != -1 {
		return fmt.Errorf("--nats-port %d: without --nats-authorized-keys the embedded NATS server has no client port (this PoP connects in process);\n"+
			"list the PoPs' keys with --nats-authorized-keys, or open it to anyone on this machine with --nats-allow-anonymous", f.natsListen)
	}
	if f.natsURL != "" {
		if f.natsAuthorized != "" {
			return errors.New("--nats-authorized-keys configures the embedded NATS server; with --nats, the servers' own configuration lets PoPs in (deploy/nats)")
		}
		return nil
	}
	if f.natsAuthorized == "" {
		return nil // StartServer refuses a --nats-host beyond loopback, and opens no client port without --nats-allow-anonymous
	}
	keys, err := replication.ReadAuthorizedKeys(f.natsAuthorized, t)
	if err != nil {
		return fmt.Errorf("--nats-authorized-keys: %w", err)
	}
	if f.natsNKey == "" {
		return errors.New("--nats-authorized-keys lets in only the PoPs' nkeys: give this PoP's seed with --nats-nkey")
	}
	seed, err := os.ReadFile(f.natsNKey)
	if err != nil {
		return fmt.Errorf("--nats-nkey: %w", err)
	}
	kp, err := nkeys.ParseDecoratedNKey(seed)
	if err != nil {
		return fmt.Errorf("--nats-nkey %s: %w", f.natsNKey, err)
	}
	pub, err := kp.PublicKey()
	if err != nil {
		return fmt.Errorf("--nats-nkey %s: %w", f.natsNKey, err)
	}
	for _, k := range keys {
		if k.POP == f.pop {
			if k.PublicKey != pub {
				return fmt.Errorf("--nats-authorized-keys lists %s for PoP %s, but --nats-nkey's public key is %s", k.PublicKey, f.pop, pub)
			}
			f.natsUsers = keys
			return nil
		}
	}
	return fmt.Errorf("--nats-authorized-keys does not list this PoP (%s)", f.pop)
}

// checkSeed checks that file holds a user nkey seed.
func checkSeed(file string) error {
	seed, err := os.ReadFile(file)
	if err != nil {
		return err
	}
	kp, err := nkeys.ParseDecoratedNKey(seed)
	if err != nil {
		return fmt.Errorf("%s: %w", file, err)
	}
	if pub, err := kp.PublicKey(); err != nil || !nkeys.IsValidPublicUserKey(pub) {
		return fmt.Errorf("%s holds no user nkey seed", file)
	}
	return nil
}
