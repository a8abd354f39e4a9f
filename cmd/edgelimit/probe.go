package main

import (
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"
)

const probeUsage = `Usage: edgelimit probe [flags]

Asks a PoP on this machine whether it is alive: GET http://<listen><path>,
exit status 0 on 200, 1 otherwise. It is the container image's HEALTHCHECK
(the image has no shell and no curl). --listen is read like the PoP's, from
EDGELIMIT_LISTEN too, so in the PoP's environment it finds the PoP; a
wildcard host (0.0.0.0, ::, none) is asked on loopback.

Flags:
`

func runProbe(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("probe", flag.ContinueOnError)
	fs.SetOutput(stderr)
	listen := fs.String("listen", "127.0.0.1:8080", "the PoP's --listen address")
	path := fs.String("path", "/healthz", "what to ask: /healthz (the process serves) or /readyz (rules loaded, store answering)")
	timeout := fs.Duration("timeout", 2*time.Second, "how long to wait for the answer")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), probeUsage)
		fs.PrintDefaults()
	}
	if err := parseFlags(fs, args, nil); err != nil {
		return err
	}
	host, port, err := net.SplitHostPort(*listen)
	if err != nil {
		return fmt.Errorf("--listen %q: %v", *listen, err)
	}
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		host = "127.0.0.1"
	}
	url := "http://" + net.JoinHostPort(host, port) + *path
	client := &http.Client{Timeout: *timeout}
	resp, err := client.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<16))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s", url, resp.Status)
	}
	fmt.Fprintf(stdout, "%s: %s\n", url, resp.Status)
	return nil
}
