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
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/changegate/changegate/test/mongowire"
)

func main() {
	opts := mongowire.Options{}
	flag.StringVar(&opts.Addr, "listen", "127.0.0.1:27017", "TCP address to listen on")
	flag.StringVar(&opts.ReplicaSetName, "replset", "rs0", "replica set name reported by hello")
	flag.IntVar(&opts.OplogMaxEntries, "oplog-max-entries", 0, "keep at most this many changes for resuming change streams (0: unbounded)")
	flag.DurationVar(&opts.OplogMaxAge, "oplog-max-age", 0, "keep changes at most this long for resuming change streams (0: unbounded)")
	flag.IntVar(&opts.CommandLogLimit, "command-log", -1, "keep this many received commands in memory (-1: none)")
	verbose := flag.Bool("v", false, "log connections and protocol errors")
	flag.Parse()

	level := slog.LevelInfo
	if *verbose {
		level = slog.LevelDebug
	}
	opts.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	srv, err := mongowire.Start(opts)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Fprintf(os.Stderr, "mongowire: serving %s\n", srv.URI())
	<-ctx.Done()
	if err := srv.Close(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
