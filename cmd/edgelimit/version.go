package main

import (
	"flag"
	"fmt"
	"io"
	"runtime/debug"
)

// runVersion prints the version of the edgelimit module this binary was
// built from and the commit, as the Go toolchain recorded them.
func runVersion(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("version", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), "Usage: edgelimit version\n\nPrints the module version, the commit and its time, and the Go version the binary was built with.\n")
	}
	if err := parseFlags(fs, args, nil); err != nil {
		return err
	}
	info, ok := debug.ReadBuildInfo()
	if !ok {
		info = nil
	}
	fmt.Fprintln(stdout, versionLine(info))
	return nil
}

// buildVersion is versionLine of this binary.
func buildVersion() string {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		info = nil
	}
	return versionLine(info)
}

// versionLine is one line naming the module version, the commit (marked
// modified when the work tree had changes), its time and the Go version of
// info; nil info is a binary built without module support.
func versionLine(info *debug.BuildInfo) string {
	if info == nil {
		return "edgelimit (unknown version: built without module information)"
	}
	version := info.Main.Version
	if version == "" {
		version = "(devel)"
	}
	var revision, at string
	modified := false
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.revision":
			revision = s.Value
		case "vcs.time":
			at = s.Value
		case "vcs.modified":
			modified = s.Value == "true"
		}
	}
	line := "edgelimit " + version
	if revision != "" {
		line += " commit " + revision
		if modified {
			line += " (modified)"
		}
		if at != "" {
			line += " of " + at
		}
	} else {
		line += " (no commit recorded: built outside a git checkout, or with -buildvcs=false)"
	}
	return line + ", " + info.GoVersion
}
