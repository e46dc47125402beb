// Package events keeps the index true.
package events
