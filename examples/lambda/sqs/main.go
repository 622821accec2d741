// Command sqs is a Lambda function fed by an SQS event source mapping on the
// queue changegate's sqs sink sends to (or on a queue an EventBridge rule
// forwards to). It reports partial batch failures, so only the failed
// messages come back (enable ReportBatchItemFailures on the mapping).
package main

import (
	"context"
	"log"

	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-lambda-go/lambda"

	"github.com/changegate/changegate/receive"
)

func handle(ctx context.Context, ev events.SQSEvent) (events.SQSEventResponse, error) {
	var resp events.SQSEventResponse
	for _, rec := range ev.Records {
		// The body is the envelope, or an EventBridge event whose detail is
		// the envelope; FromSQSBody reads both.
		env, err := receive.FromSQSBody(rec.Body)
		if err != nil {
			log.Printf("message %s: %v", rec.MessageId, err)
			resp.BatchItemFailures = append(resp.BatchItemFailures, events.SQSBatchItemFailure{ItemIdentifier: rec.MessageId})
			continue
		}
		// Deduplicate on env.ID (a standard queue may deliver a message
		// twice, and changegate re-sends the same event id after a crash).
		log.Printf("%s %s %s.%s key=%s", env.ID, env.OperationType, env.NS.DB, env.NS.Coll, env.DocumentKey)
	}
	return resp, nil
}

func main() { lambda.Start(handle) }
