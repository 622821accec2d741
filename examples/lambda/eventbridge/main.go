// Command eventbridge is a Lambda function that is the target of an
// EventBridge rule on the bus changegate's eventbridge sink publishes to:
// the event's detail is the changegate envelope.
package main

import (
	"context"
	"log"

	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-lambda-go/lambda"

	"github.com/changegate/changegate/receive"
)

func handle(ctx context.Context, ev events.EventBridgeEvent) error {
	env, err := receive.Decode(ev.Detail)
	if err != nil {
		return err
	}
	// ev.ID is EventBridge's own id, new on every PutEvents; env.ID is
	// changegate's stable event id: deduplicate on env.ID.
	log.Printf("%s %s %s.%s key=%s updated=%v", env.ID, env.OperationType, env.NS.DB, env.NS.Coll,
		env.DocumentKey, env.UpdateDescription != nil)
	return nil
}

func main() { lambda.Start(handle) }
