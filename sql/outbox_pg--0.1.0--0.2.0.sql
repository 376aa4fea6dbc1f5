/* outbox_pg--0.1.0--0.2.0.sql */

-- complain if script is sourced in psql, rather than via CREATE EXTENSION
\echo Use "ALTER EXTENSION outbox_pg UPDATE TO '0.2.0'" to load this file. \quit

-- A fresh CREATE EXTENSION runs outbox_pg--0.1.0.sql and then this script,
-- so a new install and an upgraded one are the same by construction.
-- Like the install script, everything is schema-qualified, operators
-- included.  Sections are kept apart so each stays readable on its own.

------------------------------------------------------------------------
-- Ordering, gap safety and retention of the outbox
------------------------------------------------------------------------



------------------------------------------------------------------------
-- The full inbox: messages and handlers
------------------------------------------------------------------------



------------------------------------------------------------------------
-- Operability: monitoring, health, metrics, admin functions
------------------------------------------------------------------------



------------------------------------------------------------------------
-- Brokers: SNS, SQS, RabbitMQ
------------------------------------------------------------------------



------------------------------------------------------------------------
-- Privileges: whatever the sections above created is not for PUBLIC
------------------------------------------------------------------------

REVOKE ALL ON ALL TABLES IN SCHEMA outbox, inbox FROM PUBLIC;
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA outbox, inbox FROM PUBLIC;
