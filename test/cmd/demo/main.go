// Command demo is a DEMO of changegate on the in-memory test server: it
// starts test/mongowire (a MongoDB wire-protocol server for tests, not a real
// MongoDB), a local webhook receiver that checks signatures and prints what
// it gets, and changegate with an example config; then it writes a few
// changes. Nothing here is for production: run `changegate run -config FILE`
// against a real replica set for that.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/changegate/changegate/app"
	"github.com/changegate/changegate/config"
	"github.com/changegate/changegate/test/mongowire"
	"github.com/changegate/changegate/test/receiver"
)

const secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"

const demoConfig = `
[mongo]
uri = "%URI%"

[server]
listen = "127.0.0.1:0"   # any free port; the demo prints it
public_read = true       # a local demo: status and dead letters without a token

[[sources]]
name = "orders"
database = "shop"
collection = "orders"
full_document = "updateLookup"

[[sinks]]
name = "billing"
type = "webhook"
url = "%URL%"
secret = "${DEMO_SECRET}"
allow_private_networks = true   # the demo receiver is on 127.0.0.1

[[rules]]
name = "paid-orders"
source = "orders"
operations = ["insert", "update"]
filter = { "fullDocument.status" = "paid", "fullDocument.total" = { "$gte" = 100 } }
sinks = ["billing"]
`

func main() {
	stay := flag.Bool("stay", false, "keep running after the demo writes (until Ctrl-C), so you can write more changes with any MongoDB client")
	flag.Parse()
	if err := run(*stay); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

func run(stay bool) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))

	srv, err := mongowire.Start(mongowire.Options{})
	if err != nil {
		return err
	}
	defer srv.Close()
	rcv := receiver.New(secret)
	defer rcv.Close()
	received := make(chan struct{}, 100)
	rcv.OnDelivery(func(d receiver.Delivery) {
		fmt.Printf("\nreceiver: %s %s signature-ok=%v\n%s\n", d.Operation, d.WebhookID, d.SigOK, d.Envelope)
		received <- struct{}{}
	})

	text := strings.NewReplacer("%URI%", srv.URI(), "%URL%", rcv.URL()).Replace(demoConfig)
	fmt.Printf("DEMO on test/mongowire (in-memory MongoDB wire-protocol test server) at %s\nconfig:%s\n", srv.URI(), text)
	cfg, err := config.Parse("demo.toml", []byte(text), func(k string) (string, bool) {
		if k == "DEMO_SECRET" {
			return secret, true
		}
		return os.LookupEnv(k)
	})
	if err != nil {
		return err
	}
	gctx, cancel := context.WithCancel(ctx)
	defer cancel()
	started := make(chan string, 1)
	done := make(chan error, 1)
	go func() {
		done <- app.Run(gctx, cfg, app.Options{Logger: log, Started: func(addr string) { started <- addr }})
	}()
	var admin string
	select {
	case admin = <-started:
	case err := <-done:
		return err
	}

	client, err := mongo.Connect(options.Client().ApplyURI(srv.URI()))
	if err != nil {
		return err
	}
	defer client.Disconnect(context.Background())
	orders := client.Database("shop").Collection("orders")
	time.Sleep(300 * time.Millisecond) // let the change stream open
	writes := []struct {
		what string
		f    func() error
	}{
		{"insert a paid order of 250 (matches)", func() error {
			_, err := orders.InsertOne(ctx, bson.D{{Key: "_id", Value: 1}, {Key: "status", Value: "paid"}, {Key: "total", Value: 250}})
			return err
		}},
		{"insert a pending order (filtered out)", func() error {
			_, err := orders.InsertOne(ctx, bson.D{{Key: "_id", Value: 2}, {Key: "status", Value: "pending"}, {Key: "total", Value: 120}})
			return err
		}},
		{"mark order 2 paid (matches, with updateLookup)", func() error {
			_, err := orders.UpdateOne(ctx, bson.D{{Key: "_id", Value: 2}}, bson.D{{Key: "$set", Value: bson.D{{Key: "status", Value: "paid"}}}})
			return err
		}},
		{"delete order 1 (no rule for deletes)", func() error {
			_, err := orders.DeleteOne(ctx, bson.D{{Key: "_id", Value: 1}})
			return err
		}},
	}
	for _, w := range writes {
		fmt.Printf("\nwrite: %s\n", w.what)
		if err := w.f(); err != nil {
			return err
		}
	}
	for i := 0; i < 2; i++ {
		select {
		case <-received:
		case <-time.After(10 * time.Second):
			return fmt.Errorf("the receiver got %d of 2 expected events", i)
		}
	}
	fmt.Printf("\nThe receiver got 2 events (the two matching paid orders). Status: http://%s/api/v1/status  Metrics: http://%s/metrics\n", admin, admin)
	if stay {
		fmt.Printf("Still running; write to %s with any MongoDB client. Ctrl-C to stop.\n", srv.URI())
		<-ctx.Done()
	}
	cancel()
	return <-done
}
