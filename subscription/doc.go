// Package subscription owns the subscriptions that the teams receiving
// events manage themselves at runtime: a rule plus its own webhook sink,
// created, changed, paused, resumed and deleted through the admin API and
// applied by every replica without a restart.
//
// It owns:
//   - the model ([Subscription]: the JSON form as accepted, its status,
//     the cluster time it was created at, its revision) and its validation
//     ([Validator]: config.ParseSubscriptionJSON, the decoder of [[rules]]
//     and [[sinks]], plus the names the configuration file already uses
//     and the private-network guard of the webhook sink);
//   - the signing secrets: generated ("whsec_" + 32 random bytes), returned
//     once, stored sealed with AES-256-GCM under the operator's key
//     ([Sealer]), rotated with an overlap during which the old secret signs
//     too ([Subscription.SigningSecrets]);
//   - the store in MongoDB ([Store]: the "subscriptions" collection of the
//     state database, format-versioned, with optimistic concurrency and
//     cursor pagination) and its audit log ("subscriptions_audit", also
//     written to the process log: who, what, when; never a secret);
//   - [Store.Watch], which follows the collection so that every replica
//     sees each change within a poll interval (1 s).
//
// It does not serve HTTP (package api does) nor build sinks and rules (the
// gateway applies what Watch yields through its reload path).
package subscription
