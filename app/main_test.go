package app_test

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/changegate/changegate/test/mongotest"
	"github.com/changegate/changegate/test/mongowire"
)

// childEnv makes the test binary serve test/mongowire instead of running
// tests (see outOfProcessURI).
const childEnv = "CHANGEGATE_TEST_MONGOWIRE_CHILD"

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) == "1" {
		srv, err := mongowire.Start(mongowire.Options{CommandLogLimit: -1})
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		fmt.Println(srv.URI())
		// Serve until the parent closes stdin (or dies).
		_, _ = bufio.NewReader(os.Stdin).ReadString('\n')
		_ = srv.Close()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// outOfProcessURI returns a MongoDB whose data does not live in the test's
// heap: CHANGEGATE_TEST_MONGODB_URI, or test/mongowire in a child process
// (this test binary, see TestMain), stopped at cleanup. Memory tests use it.
func outOfProcessURI(t *testing.T) string {
	t.Helper()
	if uri := os.Getenv(mongotest.EnvURI); uri != "" {
		return uri
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"=1")
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = stdin.Close()
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	})
	line := make(chan string, 1)
	go func() {
		s, _ := bufio.NewReader(stdout).ReadString('\n')
		line <- strings.TrimSpace(s)
	}()
	select {
	case uri := <-line:
		if !strings.HasPrefix(uri, "mongodb://") {
			t.Fatalf("mongowire child: %q", uri)
		}
		return uri
	case <-time.After(30 * time.Second):
		t.Fatal("mongowire child did not start")
		return ""
	}
}
