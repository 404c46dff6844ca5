"""scheduler_svc"""
