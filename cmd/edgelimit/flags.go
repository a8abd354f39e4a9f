package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"regexp"
	"sort"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// errUsage marks a flag error that has already been reported.
var errUsage = errors.New("usage")

// usageError is a command line or setting a command refused before it ran:
// an unknown flag, a flag without its value, a value that does not parse, a
// stray argument. run prints it as one line that ends pointing at the
// command's --help, and exits 2.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

// helpRequest is -h or --help: run prints the command's usage to stdout and
// exits 0. It is flag.ErrHelp to errors.Is.
type helpRequest struct{ fs *flag.FlagSet }

func (h *helpRequest) Error() string { return flag.ErrHelp.Error() }
func (h *helpRequest) Unwrap() error { return flag.ErrHelp }

// printUsage writes fs's usage to w.
func printUsage(fs *flag.FlagSet, w io.Writer) {
	fs.SetOutput(w)
	if fs.Usage != nil {
		fs.Usage()
		return
	}
	fmt.Fprintf(w, "Usage of edgelimit %s:\n", fs.Name())
	fs.PrintDefaults()
}

// parseArgs parses args into fs and prints nothing: a refused command line
// comes back as a *usageError naming the flag and the form its value takes,
// and -h or --help as a *helpRequest, for run to report.
func parseArgs(fs *flag.FlagSet, args []string) error {
	out, usage := fs.Output(), fs.Usage
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	err := fs.Parse(args)
	fs.SetOutput(out)
	fs.Usage = usage
	switch {
	case err == nil:
		return nil
	case errors.Is(err, flag.ErrHelp):
		return &helpRequest{fs}
	}
	return &usageError{flagProblem(fs, err.Error())}
}

var (
	flagUndefined = regexp.MustCompile(`^flag provided but not defined: -+(.*)$`)
	flagNoValue   = regexp.MustCompile(`^flag needs an argument: -+(.*)$`)
	flagBadValue  = regexp.MustCompile(`^invalid (?:boolean )?value ("(?:[^"\\]|\\.)*") for (?:flag )?-+([^:]+): (.*)$`)
)

// flagProblem rewrites a message of the flag package in the words of this
// command's documentation: flags with two dashes, and a bad value with the
// form the flag wants.
func flagProblem(fs *flag.FlagSet, msg string) string {
	if m := flagUndefined.FindStringSubmatch(msg); m != nil {
		return "unknown flag --" + m[1]
	}
	if m := flagNoValue.FindStringSubmatch(msg); m != nil {
		return "flag --" + m[1] + " needs a value"
	}
	if m := flagBadValue.FindStringSubmatch(msg); m != nil {
		return fmt.Sprintf("invalid value %s for --%s: %s", m[1], m[2], wantOf(fs.Lookup(m[2]), m[3]))
	}
	return msg
}

// wantOf says what form f's value takes, for a flag of the standard kinds;
// for another kind, problem is its own error, which says so.
func wantOf(f *flag.Flag, problem string) string {
	if f == nil {
		return problem
	}
	g, ok := f.Value.(flag.Getter)
	if !ok {
		return problem
	}
	switch g.Get().(type) {
	case time.Duration:
		return "want a duration such as 500ms, 10s or 1m30s"
	case bool:
		return "want true or false"
	case int, int64:
		return "want a whole number"
	case uint, uint64:
		return "want a whole number, 0 or more"
	case float64:
		return "want a number"
	}
	return problem
}

// parseFlags parses args into fs, then fills every flag the command line did
// not set from the environment (EDGELIMIT_<FLAG>, upper case, '-' as '_'), then
// from the YAML config file named by the -config flag (keys are flag names).
// The command line wins over the environment, which wins over the file. A bad
// value anywhere is one error naming its source.
func parseFlags(fs *flag.FlagSet, args []string, config *string) error {
	if err := parseArgs(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return &usageError{fmt.Sprintf("unexpected argument %q (flags only)", fs.Arg(0))}
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })

	var err error
	fs.VisitAll(func(f *flag.Flag) {
		env := "EDGELIMIT_" + strings.ToUpper(strings.ReplaceAll(f.Name, "-", "_"))
		if v, ok := os.LookupEnv(env); ok && !set[f.Name] && err == nil {
			if e := fs.Set(f.Name, v); e != nil {
				err = &usageError{fmt.Sprintf("environment %s=%q: %s", env, v, wantOf(f, e.Error()))}
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
			return &usageError{fmt.Sprintf("config file %s:%d: unknown setting %q (settings are the flag names)", *config, n.Line, k)}
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
			return &usageError{fmt.Sprintf("config file %s:%d: %s: %s", *config, n.Line, k, wantOf(fs.Lookup(k), err.Error()))}
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
