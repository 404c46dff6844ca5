"""Scheduling plugins, one small class per idea, composed into policies by analysim.core.policies."""
