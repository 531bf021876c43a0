"""Payments: paying at a channel, the channel's notifications, refunds and reconciliation."""
