"""mlaas_monitor"""
