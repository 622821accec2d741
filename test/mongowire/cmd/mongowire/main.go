// Command mongowire serves an in-memory MongoDB look-alike (a one-node
// replica set) on a TCP address until interrupted:
//
//	go run ./test/mongowire/cmd/mongowire -listen 127.0.0.1:27017
//
// Connect with mongodb://127.0.0.1:27017/?replicaSet=rs0 (or
// ?directConnection=true). Data lives in memory and is lost on exit.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/changegate/changegate/test/mongowire"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "mongowire:", err)
		os.Exit(1)
	}
}

// run parses args, serves until ctx is done, and reports the server's URI
// as "mongowire: serving URI" on out.
func run(ctx context.Context, args []string, out io.Writer) error {
	fs := flag.NewFlagSet("mongowire", flag.ContinueOnError)
	fs.SetOutput(out)
	opts := mongowire.Options{}
	fs.StringVar(&opts.Addr, "listen", "127.0.0.1:27017", "TCP address to listen on")
	fs.StringVar(&opts.ReplicaSetName, "replset", "rs0", "replica set name reported by hello")
	fs.IntVar(&opts.OplogMaxEntries, "oplog-max-entries", 0, "keep at most this many changes for resuming change streams (0: unbounded)")
	fs.DurationVar(&opts.OplogMaxAge, "oplog-max-age", 0, "keep changes at most this long for resuming change streams (0: unbounded)")
	fs.IntVar(&opts.CommandLogLimit, "command-log", -1, "keep this many received commands in memory (-1: none)")
	fs.BoolVar(&opts.StreamingHello, "streaming-hello", false, "report topologyVersion in hello, so drivers use the streaming (awaitable) hello protocol")
	verbose := fs.Bool("v", false, "log connections and protocol errors")
	if err := fs.Parse(args); err != nil {
		return err
	}
	level := slog.LevelInfo
	if *verbose {
		level = slog.LevelDebug
	}
	opts.Logger = slog.New(slog.NewTextHandler(out, &slog.HandlerOptions{Level: level}))

	srv, err := mongowire.Start(opts)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "mongowire: serving %s\n", srv.URI())
	<-ctx.Done()
	return srv.Close()
}
