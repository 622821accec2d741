package main

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/changegate/changegate"

// TestNoTestCodeInBinary: the binary links none of the repository's test
// packages (test/...: the MongoDB test server with its update, sort and
// projection semantics, fakes, receivers), only what production needs.
func TestNoTestCodeInBinary(t *testing.T) {
	deps := listDeps(t, ".")
	// The check means something only if the listing is the real one.
	for _, want := range []string{module + "/app", module + "/query"} {
		if !slices.Contains(deps, want) {
			t.Fatalf("go list -deps: %s missing from %d packages; the listing is wrong", want, len(deps))
		}
	}
	for _, p := range deps {
		if p == module+"/test" || strings.HasPrefix(p, module+"/test/") {
			t.Errorf("changegate's binary depends on test package %s", p)
		}
	}
}

// listDeps returns the import paths of the non-test dependencies of the
// package in dir, itself included (go list -deps).
func listDeps(t *testing.T, dir string) []string {
	t.Helper()
	goCmd, err := exec.LookPath("go")
	if err != nil {
		goCmd = filepath.Join(os.Getenv("GOROOT"), "bin", "go")
	}
	cmd := exec.Command(goCmd, "list", "-deps", "-f", "{{.ImportPath}}", ".")
	cmd.Dir = dir
	out, err := cmd.Output()
	if err != nil {
		var stderr []byte
		if ee := (*exec.ExitError)(nil); errors.As(err, &ee) {
			stderr = ee.Stderr
		}
		t.Fatalf("go list -deps: %v\n%s", err, stderr)
	}
	return strings.Fields(string(out))
}
