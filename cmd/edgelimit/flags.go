package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"sort"
	"strings"

	"go.yaml.in/yaml/v3"
)

// errUsage marks a flag error that has already been reported with usage.
var errUsage = errors.New("usage")

// parseFlags parses args into fs, then fills every flag the command line did
// not set from the environment (EDGELIMIT_<FLAG>, upper case, '-' as '_'), then
// from the YAML config file named by the -config flag (keys are flag names).
// The command line wins over the environment, which wins over the file. A bad
// value anywhere is one error naming its source.
func parseFlags(fs *flag.FlagSet, args []string, config *string) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return errUsage
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q (flags only; see --help)", fs.Arg(0))
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })

	var err error
	fs.VisitAll(func(f *flag.Flag) {
		env := "EDGELIMIT_" + strings.ToUpper(strings.ReplaceAll(f.Name, "-", "_"))
		if v, ok := os.LookupEnv(env); ok && !set[f.Name] && err == nil {
			if e := fs.Set(f.Name, v); e != nil {
				err = fmt.Errorf("environment %s=%q: %v", env, v, e)
			}
			set[f.Name] = true
		}
	})
	if err != nil || config == nil || *config == "" {
		return err
	}
	data, err := os.ReadFile(*config)
	if err != nil {
		return fmt.Errorf("config file: %w", err)
	}
	var values map[string]yaml.Node
	if err := yaml.Unmarshal(data, &values); err != nil {
		return fmt.Errorf("config file %s: %v", *config, err)
	}
	names := make([]string, 0, len(values))
	for k := range values {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, k := range names {
		n := values[k]
		if fs.Lookup(k) == nil || k == "config" {
			return fmt.Errorf("config file %s:%d: unknown setting %q (settings are the flag names of 'edgelimit %s --help')", *config, n.Line, k, fs.Name())
		}
		if set[k] {
			continue
		}
		v := n.Value
		if n.Kind == yaml.SequenceNode { // a list, for flags that take several values
			var items []string
			for _, c := range n.Content {
				items = append(items, c.Value)
			}
			v = strings.Join(items, ",")
		}
		if err := fs.Set(k, v); err != nil {
			return fmt.Errorf("config file %s:%d: %s: %v", *config, n.Line, k, err)
		}
	}
	return nil
}

// listFlag is a flag that takes a comma-separated list, or repeats.
type listFlag struct {
	values []string
	set    bool
}

func (l *listFlag) String() string { return strings.Join(l.values, ",") }

func (l *listFlag) Set(v string) error {
	if !l.set { // the first explicit value replaces the default
		l.values, l.set = nil, true
	}
	for _, p := range strings.Split(v, ",") {
		if p = strings.TrimSpace(p); p != "" {
			l.values = append(l.values, p)
		}
	}
	return nil
}
