package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/nats-io/nkeys"

	"github.com/edgelimit/edgelimit/region"
	"github.com/edgelimit/edgelimit/replication"
)

const natsconfUsage = `Usage: edgelimit natsconf --topology 'eu=eu-1,eu-2;us=us-1' --keys DIR

Writes one NATS credential per PoP of the topology and the servers' side of it, so that
each PoP may publish only its own subjects:

  DIR/<pop>.nk                 the PoP's nkey seed (mode 0600; kept when it exists): give it
                               to that PoP only, as --nats-nkey. It may publish the PoP's own
                               subjects and create its region's stream, never change one
  DIR/admin.nk                 the operator's seed: creates and updates the streams
                               (--nats-admin-nkey, for PoPs on external NATS servers); keep it
                               off the PoPs otherwise
  DIR/leaf.nk                  the leaf links' seed: a leaf region's NATS server logs in with
                               it at the hub (embedded: --nats-leaf-nkey); it relays every
                               subject, so only the leaf regions' servers (or the PoPs that run
                               them) hold it
  DIR/leaf-remote.conf         the same seed as a nats-server setting (nkey: SU…, mode 0600):
                               deploy/nats/leaf-region.conf's remote includes it from keys/
  DIR/leaf.pub                 leaf.nk's public key, which the hub's nats-servers let in
                               (deploy/nats: EDGELIMIT_LEAF_NKEY)
  DIR/authorized_keys          "<pop> <public nkey>" lines, and "_admin" and "_leaf" ones, for
                               embedded NATS servers (--nats-authorized-keys)
  DIR/edgelimit-accounts.conf  the accounts section of a nats-server configuration
                               (deploy/nats/*.conf include it)

Only public keys leave the seed files, so the other three files hold no secret. Run it again
after changing the topology: existing seeds are kept, new PoPs get new ones.

Flags:
`

// runNatsconf writes per-PoP credentials and permission blocks.
func runNatsconf(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("natsconf", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var topo, dir string
	fs.StringVar(&topo, "topology", "", "every region's PoPs: `region=pop,pop;region=pop` (as the PoPs' --topology)")
	fs.StringVar(&dir, "keys", "", "`directory` for the seeds and generated files (created if missing)")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), natsconfUsage)
		fs.PrintDefaults()
	}
	if err := parseFlags(fs, args, nil); err != nil {
		return err
	}
	if dir == "" {
		return errors.New("--keys is required")
	}
	t, err := region.Parse(topo)
	if err != nil {
		return fmt.Errorf("--topology: %w", err)
	}
	if len(t.Regions) == 0 {
		return errors.New("--topology names no PoP")
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	var keys []replication.PoPKey
	var authorized strings.Builder
	authorized.WriteString("# <pop> <public nkey>, written by edgelimit natsconf\n")
	for _, r := range t.Names() {
		for _, p := range t.Regions[r] {
			pub, created, err := popSeed(filepath.Join(dir, p+".nk"))
			if err != nil {
				return fmt.Errorf("PoP %s: %w", p, err)
			}
			if created {
				fmt.Fprintf(stdout, "new seed %s\n", filepath.Join(dir, p+".nk"))
			}
			keys = append(keys, replication.PoPKey{Region: r, POP: p, PublicKey: pub})
			fmt.Fprintf(&authorized, "%s %s\n", p, pub)
		}
	}
	var admin, leaf string
	for _, user := range []string{replication.AdminUser, replication.LeafUser} {
		file := filepath.Join(dir, strings.TrimPrefix(user, "_")+".nk")
		pub, created, err := popSeed(file)
		if err != nil {
			return fmt.Errorf("%s: %w", file, err)
		}
		if created {
			fmt.Fprintf(stdout, "new seed %s\n", file)
		}
		switch user {
		case replication.AdminUser:
			admin = pub
		case replication.LeafUser:
			leaf = pub
		}
		fmt.Fprintf(&authorized, "%s %s\n", user, pub)
	}
	if err := writeLeafRemote(dir, stdout); err != nil {
		return err
	}
	command := "edgelimit natsconf --topology '" + topo + "'"
	for name, data := range map[string][]byte{
		"authorized_keys":         []byte(authorized.String()),
		"edgelimit-accounts.conf": replication.AccountsConf(keys, admin, command),
		"leaf.pub":                []byte(leaf + "\n"),
	} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "wrote %s\n", filepath.Join(dir, name))
	}
	return nil
}

// writeLeafRemote writes dir/leaf-remote.conf, leaf.nk's seed as the nkey
// of a nats-server leaf remote, mode 0600: a remote takes its nkey only as
// the seed itself, and an include keeps it out of the environment and of the
// configuration the servers share.
func writeLeafRemote(dir string, stdout io.Writer) error {
	raw, err := os.ReadFile(filepath.Join(dir, "leaf.nk"))
	if err != nil {
		return err
	}
	kp, err := nkeys.ParseDecoratedNKey(raw)
	if err != nil {
		return fmt.Errorf("%s: %w", filepath.Join(dir, "leaf.nk"), err)
	}
	seed, err := kp.Seed()
	if err != nil {
		return err
	}
	file := filepath.Join(dir, "leaf-remote.conf")
	text := "# The leaf links' nkey seed (leaf.nk), written by edgelimit natsconf: a leaf region's\n" +
		"# nats-servers include it in their leaf remote (deploy/nats/leaf-region.conf). A secret:\n" +
		"# only those servers hold it.\n" +
		"nkey: " + string(seed) + "\n"
	if err := os.WriteFile(file, []byte(text), 0o600); err != nil {
		return err
	}
	if err := os.Chmod(file, 0o600); err != nil { // WriteFile keeps an existing file's mode
		return err
	}
	fmt.Fprintf(stdout, "wrote %s\n", file)
	return nil
}

// popSeed returns the public key of the nkey seed in path, creating the seed
// (mode 0600) when the file does not exist.
func popSeed(path string) (pub string, created bool, err error) {
	seed, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		kp, err := nkeys.CreateUser()
		if err != nil {
			return "", false, err
		}
		if seed, err = kp.Seed(); err != nil {
			return "", false, err
		}
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			return "", false, err
		}
		_, werr := f.Write(append(seed, '\n'))
		if err := errors.Join(werr, f.Close()); err != nil {
			return "", false, err
		}
		created = true
	} else if err != nil {
		return "", false, err
	}
	kp, err := nkeys.ParseDecoratedNKey(seed)
	if err != nil {
		return "", false, fmt.Errorf("%s: %w", path, err)
	}
	if pub, err = kp.PublicKey(); err != nil {
		return "", false, err
	}
	if !nkeys.IsValidPublicUserKey(pub) {
		return "", false, fmt.Errorf("%s holds a seed of another kind than a user (%s...)", path, pub[:1])
	}
	return pub, created, nil
}
